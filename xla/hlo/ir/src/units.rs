//! Byte counts as people write and read them: `80GB`, `64GiB`, `1.5 KiB`.
//! The tools' `--memory-limit` flags read them; memory errors print them.
//!
//! Invariants: parsing uses checked arithmetic (a count that does not fit in
//! a `u64` is an error, never a wrap); K, M, G, T are powers of 1000 and
//! Ki, Mi, Gi, Ti powers of 1024, as in the units' standard meaning.

/// Reads a byte count: digits with an optional K, M, G, T (powers of 1000)
/// or Ki, Mi, Gi, Ti (powers of 1024) suffix and an optional trailing B.
pub fn parse_byte_count(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    let number = trimmed.strip_suffix(['B', 'b']).unwrap_or(trimmed);
    let split = number
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(number.len());
    let (digits, suffix) = number.split_at(split);
    let count: u64 = digits
        .parse()
        .map_err(|_| format!("'{text}' is not a byte count (e.g. 80000000000, 80GB, 64GiB)"))?;
    let unit: u64 = match suffix.to_ascii_lowercase().as_str() {
        "" => 1,
        "k" => 1_000,
        "m" => 1_000_000,
        "g" => 1_000_000_000,
        "t" => 1_000_000_000_000,
        "ki" => 1 << 10,
        "mi" => 1 << 20,
        "gi" => 1 << 30,
        "ti" => 1 << 40,
        _ => return Err(format!("'{text}': unknown unit '{suffix}'")),
    };
    count
        .checked_mul(unit)
        .ok_or_else(|| format!("'{text}' is too large"))
}

/// `bytes` for people, in powers of 1024: `512 B`, `1.5 KiB`, `256.0 GiB`.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_formats() {
        assert_eq!(parse_byte_count("80GB"), Ok(80_000_000_000));
        assert_eq!(parse_byte_count("64GiB"), Ok(64 << 30));
        assert_eq!(parse_byte_count(" 1024 "), Ok(1024));
        assert!(parse_byte_count("1XB").is_err());
        assert!(parse_byte_count("99999999999999999999").is_err());
        assert!(parse_byte_count("20000000Ti").is_err());
        assert_eq!(format_bytes(512), "512 B");
        assert_eq!(format_bytes(1536), "1.5 KiB");
        assert_eq!(format_bytes(256 << 30), "256.0 GiB");
    }
}
