//! Target `plan`: bytes as a plan file, through [`PlanFile::from_bytes`]
//! (magic, version, preamble lengths, checksums, the header's JSON and
//! [`PlanHeader::validate`](gerbil_plan::PlanHeader::validate)), the checks
//! `PlanFile::open` runs on a file.
//!
//! The input is read twice: as it is, and [`with_checksums`] — the
//! checksums recomputed and a missing data region filled with zeros — since a
//! mutated header would otherwise never get past its CRC. So a corpus plan
//! can be stored without its weights: preamble and header are enough.

use gerbil_plan::PlanFile;

/// Largest data region [`with_checksums`] fills in.
const MAX_FILLED_DATA: u64 = 4 << 20;
const PREAMBLE_LEN: usize = 48;

/// Runs the input, as it is and with its checksums fixed, through the plan reader.
pub fn plan(data: &[u8]) {
    let _ = PlanFile::from_bytes("fuzz.plan", data.to_vec());
    if let Some(fixed) = with_checksums(data) {
        let _ = PlanFile::from_bytes("fuzz.plan", fixed);
    }
}

fn u64_at(data: &[u8], at: usize) -> u64 {
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&data[at..at + 8]);
    u64::from_le_bytes(bytes)
}

/// The input with a data region of zeros appended up to the length the
/// preamble says (at most [`MAX_FILLED_DATA`] more bytes) and both CRCs
/// recomputed; `None` when the preamble's lengths do not describe a file
/// (those cases are the raw run's).
pub fn with_checksums(data: &[u8]) -> Option<Vec<u8>> {
    if data.len() < PREAMBLE_LEN {
        return None;
    }
    let header_len = u64_at(data, 16);
    let data_offset = u64_at(data, 24);
    let data_len = u64_at(data, 32);
    let header_end = (PREAMBLE_LEN as u64).checked_add(header_len)?;
    let end = data_offset.checked_add(data_len)?;
    if data_offset < header_end || end > data.len() as u64 + MAX_FILLED_DATA {
        return None;
    }
    let mut plan = data.to_vec();
    if (plan.len() as u64) < end {
        plan.resize(end as usize, 0);
    }
    let header_crc = crc32fast::hash(&plan[PREAMBLE_LEN..header_end as usize]);
    let data_crc = crc32fast::hash(&plan[data_offset as usize..end as usize]);
    plan[40..44].copy_from_slice(&header_crc.to_le_bytes());
    plan[44..48].copy_from_slice(&data_crc.to_le_bytes());
    Some(plan)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A committed seed (preamble and header, no data region) opens once
    /// its checksums are fixed: mutations of it reach `validate`.
    #[test]
    fn a_seed_plan_opens_with_its_checksums_fixed() {
        let seed = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../fuzz/corpus/plan/seed-mini-portable.plan"
        );
        let bytes = std::fs::read(seed).expect("the seed plan");
        assert!(PlanFile::from_bytes("seed", bytes.clone()).is_err());
        let fixed = with_checksums(&bytes).expect("a preamble that describes a file");
        if let Err(e) = PlanFile::from_bytes("seed", fixed) {
            panic!("the seed plan does not open: {e}");
        }
    }
}
