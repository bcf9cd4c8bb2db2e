//! The Go version a binary was built with, from its `.go.buildinfo` section (what
//! `go version <binary>` prints; layout as in Go's `debug/buildinfo`). The section starts with a
//! 32-byte header: the magic `"\xff Go buildinf:"`, the pointer size, then flags. With flag 2
//! (Go 1.18 and later) the version follows the header as a varint-length-prefixed string; before
//! that, two pointers at offset 16 point to Go string headers (data pointer, length) for the
//! version and the module information, resolved through the PT_LOAD segments.
use crate::host::gobin::image::Image;
use crate::host::gobin::Problem;

const MAGIC: &[u8] = b"\xff Go buildinf:";
const HEADER: usize = 32;
/// Flag bit: pointers are big-endian.
const BIG_ENDIAN: u8 = 1;
/// Flag bit: the strings follow the header inline.
const INLINE: u8 = 2;
/// No version string is longer; a larger length means the section is not what it claims.
const MAX_VERSION: u64 = 256;

/// The Go version of the binary in `image`, e.g. `go1.19.8`.
pub fn version(image: &Image) -> Result<String, Problem> {
    let section = image
        .section(".go.buildinfo")
        .ok_or(Problem::NotGo(".go.buildinfo section"))?;
    // The header and an inline version string fit in the first 32 + 10 + 256 bytes.
    let len = section.size.min((HEADER + 10) as u64 + MAX_VERSION);
    let data = image.read_at(section.offset, len, ".go.buildinfo")?;
    let malformed = |what: &str, at: usize| Problem::Malformed {
        what: format!(".go.buildinfo {what}"),
        offset: section.offset + at as u64,
    };
    if data.len() < HEADER || !data.starts_with(MAGIC) {
        return Err(malformed("magic", 0));
    }
    let ptr_size = usize::from(data[14]);
    let flags = data[15];
    let bytes = if flags & INLINE != 0 {
        let (len, used) = varint(&data[HEADER..]).ok_or_else(|| malformed("version length", HEADER))?;
        let start = HEADER + used;
        let end = usize::try_from(len)
            .ok()
            .and_then(|len| start.checked_add(len))
            .filter(|end| *end <= data.len() && len <= MAX_VERSION)
            .ok_or_else(|| malformed("version length", HEADER))?;
        data[start..end].to_vec()
    } else {
        if ptr_size != 4 && ptr_size != 8 {
            return Err(malformed("pointer size", 14));
        }
        let big = flags & BIG_ENDIAN != 0;
        let header_at = pointer(&data[16..], ptr_size, big);
        let header = image.read_vaddr(header_at, 2 * ptr_size as u64, "Go version string header")?;
        let text_at = pointer(&header, ptr_size, big);
        let len = pointer(&header[ptr_size..], ptr_size, big);
        if len > MAX_VERSION {
            return Err(malformed("version length", 16));
        }
        image.read_vaddr(text_at, len, "Go version string")?
    };
    String::from_utf8(bytes).map_err(|_| malformed("version (not UTF-8)", HEADER))
}

/// An unsigned LEB128 varint (Go's `binary.Uvarint`) and the number of bytes it used.
fn varint(data: &[u8]) -> Option<(u64, usize)> {
    let mut value = 0u64;
    for (i, byte) in data.iter().take(10).enumerate() {
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Some((value, i + 1));
        }
    }
    None
}

/// A pointer of `size` (4 or 8) bytes at the start of `data` (which holds at least that many).
fn pointer(data: &[u8], size: usize, big_endian: bool) -> u64 {
    let mut bytes = [0u8; 8];
    if big_endian {
        bytes[8 - size..].copy_from_slice(&data[..size]);
        u64::from_be_bytes(bytes)
    } else {
        bytes[..size].copy_from_slice(&data[..size]);
        u64::from_le_bytes(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_as_go_writes_them() {
        assert_eq!(varint(&[8, 0xff]), Some((8, 1)));
        assert_eq!(varint(&[0x96, 0x01]), Some((150, 2)));
        assert_eq!(varint(&[0x80]), None);
    }

    #[test]
    fn pointers_of_either_size_and_order() {
        assert_eq!(pointer(&[1, 2, 3, 4, 5, 6, 7, 8], 8, false), 0x0807060504030201);
        assert_eq!(pointer(&[1, 2, 3, 4], 4, true), 0x01020304);
    }
}
