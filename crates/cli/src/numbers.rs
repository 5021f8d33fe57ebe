//! Value parsers for the numeric flags of `gerbilc` and `gerbil-run`.
//!
//! Every numeric flag is declared with `allow_negative_numbers = true` and,
//! when it takes a whole number, one of these parsers: `--max-context 4096`
//! parses as usual, while `--max-context -5` says the value is negative and
//! what the flag takes. The surprise this exists for: without the clap
//! setting, `-5` reads as an unknown flag and clap's tip is to write
//! `-- -5`, which would make it a positional argument; and the penalties,
//! which may be negative, could only be given as `--presence-penalty=-1`.

/// A whole number of `u64`: 0 or more.
pub fn whole_u64(s: &str) -> Result<u64, String> {
    whole(s, u64::MAX)
}

/// A whole number of `usize`: 0 or more.
pub fn whole_usize(s: &str) -> Result<usize, String> {
    // usize::MAX fits u64 on every target gerbil builds for.
    whole(s, usize::MAX as u64).map(|n| n as usize)
}

/// A whole number from 0 to `max`, or an error saying what `s` is instead.
pub fn whole(s: &str, max: u64) -> Result<u64, String> {
    let digits = |d: &str| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit());
    match s.parse::<u64>() {
        Ok(n) if n <= max => Ok(n),
        _ if digits(s) => Err(format!("{s} is larger than the largest value, {max}")),
        _ if s.strip_prefix('-').is_some_and(digits) => {
            Err(format!("{s} is negative; give a whole number, 0 or more"))
        }
        _ if s.parse::<f64>().is_ok() => Err(format!(
            "{s} is not a whole number; give one without a fraction"
        )),
        _ => Err(format!(
            "`{s}` is not a number; give a whole number, 0 or more"
        )),
    }
}

/// A whole number of at least 1: `zero` says why 0 is refused.
pub fn positive(s: &str, zero: &str) -> Result<usize, String> {
    match whole_usize(s)? {
        0 => Err(zero.into()),
        n => Ok(n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_numbers_parse_and_others_say_what_they_are() {
        assert_eq!(whole_u64("4096"), Ok(4096));
        assert_eq!(whole_u64("0"), Ok(0));
        assert_eq!(
            whole("300", 255),
            Err("300 is larger than the largest value, 255".into())
        );
        assert_eq!(
            whole_u64("-5"),
            Err("-5 is negative; give a whole number, 0 or more".into())
        );
        assert_eq!(
            whole_u64("99999999999999999999999"),
            Err(
                "99999999999999999999999 is larger than the largest value, 18446744073709551615"
                    .into()
            )
        );
        assert_eq!(
            whole_u64("1.5"),
            Err("1.5 is not a whole number; give one without a fraction".into())
        );
        assert_eq!(
            whole_u64("lots"),
            Err("`lots` is not a number; give a whole number, 0 or more".into())
        );
        assert_eq!(positive("0", "none"), Err("none".into()));
        assert_eq!(positive("3", "none"), Ok(3));
    }
}
