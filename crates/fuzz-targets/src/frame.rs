//! How the targets cut one fuzz input into the pieces they need.
//!
//! A fuzzer mutates one byte string; targets that need several values take
//! fixed-size numbers from the front ([`take_u64`]) or split the rest at NUL
//! bytes ([`split_nul`]), which no JSON document or template the targets
//! read contains. Both are total: any input gives some pieces.

/// Takes a little-endian `u64` from the front of `data` (zero-padded when
/// fewer than 8 bytes are left) and advances past it.
pub fn take_u64(data: &mut &[u8]) -> u64 {
    let n = data.len().min(8);
    let mut bytes = [0u8; 8];
    bytes[..n].copy_from_slice(&data[..n]);
    *data = &data[n..];
    u64::from_le_bytes(bytes)
}

/// Takes one byte from the front of `data` (zero when it is empty).
pub fn take_u8(data: &mut &[u8]) -> u8 {
    match data.split_first() {
        Some((&b, rest)) => {
            *data = rest;
            b
        }
        None => 0,
    }
}

/// The pieces of `data` between NUL bytes (one piece when there is none).
pub fn split_nul(data: &[u8]) -> Vec<&[u8]> {
    data.split(|&b| b == 0).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_pieces() {
        let mut data: &[u8] = &[1, 0, 0, 0, 0, 0, 0, 0, 7, b'a', 0, b'b'];
        assert_eq!(take_u64(&mut data), 1);
        assert_eq!(take_u8(&mut data), 7);
        assert_eq!(split_nul(data), vec![&b"a"[..], &b"b"[..]]);
        let mut short: &[u8] = &[2, 1];
        assert_eq!(take_u64(&mut short), 0x0102);
        assert!(short.is_empty());
        assert_eq!(take_u8(&mut short), 0);
    }
}
