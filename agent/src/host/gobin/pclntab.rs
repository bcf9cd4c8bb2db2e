//! Finding functions by name in `.gopclntab`, the table the Go runtime itself uses for stack
//! traces, which `-s -w` does not strip. Layouts as in Go's `runtime/symtab.go` and
//! `debug/gosym/pclntab.go`:
//!
//! - header: magic (u32), two zero bytes, the PC quantum, the pointer size, then pointer-sized
//!   words: Go 1.18+ (magic `0xfffffff0`, 1.20+ `0xfffffff1`) `nfunc, nfiles, textStart,
//!   funcnameOffset, cuOffset, filetabOffset, pctabOffset, pclnOffset`; Go 1.16/1.17
//!   (`0xfffffffa`) the same without `textStart`. Offsets are from the start of the table.
//! - at `pclnOffset`, the functab: `nfunc` pairs (entry, funcoff) then one last entry, the end
//!   of the last function; Go 1.18+ stores u32 offsets from `textStart`, Go 1.16/1.17 absolute
//!   pointer-sized addresses. `funcoff` is from `pclnOffset` too and points at the function's
//!   `_func`, whose second field (after a u32 `entryoff`, or a pointer-sized `entry` before
//!   1.18) is `nameoff`, an i32 offset into the NUL-terminated names at `funcnameOffset`.
//!
//! The regions in between (cutab, filetab, pctab) are not needed and not read.

use crate::host::gobin::window::{Window, CHUNK};
use crate::host::gobin::Problem;

/// The Go 1.16/1.17 magic.
const GO116: u32 = 0xffff_fffa;
/// The Go 1.18/1.19 magic.
const GO118: u32 = 0xffff_fff0;
/// The Go 1.20+ magic.
const GO120: u32 = 0xffff_fff1;

/// The header's length that covers every word [`Header::parse`] reads.
pub const HEADER_LEN: u64 = 8 + 8 * 8;

/// What the header says about where things are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub magic: u32,
    ptr_size: u64,
    nfunc: u64,
    /// Go 1.18+: what functab entries are relative to; 0 before.
    text_start: u64,
    /// Where the function names start, from the start of the table.
    pub funcnames: u64,
    /// Where the cutab starts, which ends the names.
    pub funcnames_end: u64,
    /// Where the functab starts (the `_func`s follow it up to the end of the table).
    pub functab: u64,
}

impl Header {
    /// Parses the first bytes of the table (at least [`HEADER_LEN`], or the whole table if it
    /// is shorter). `offset` is the table's file offset, for errors; `text` the address of
    /// `.text`, used as `textStart` when the table holds 0 there (position-independent
    /// binaries, whose table is relocated at load).
    pub fn parse(data: &[u8], offset: u64, text: u64) -> Result<Header, Problem> {
        let malformed = |what: &str, at: u64| Problem::Malformed {
            what: format!(".gopclntab header: {what}"),
            offset: offset + at,
        };
        if data.len() < 8 {
            return Err(malformed("shorter than 8 bytes", 0));
        }
        let magic = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
        let go118 = match magic {
            GO118 | GO120 => true,
            GO116 => false,
            magic => return Err(Problem::UnsupportedPclntab { magic }),
        };
        if data[4] != 0 || data[5] != 0 {
            return Err(malformed("padding is not zero", 4));
        }
        let ptr_size = u64::from(data[7]);
        if ptr_size != 8 {
            return Err(malformed(&format!("pointer size {ptr_size}, not 8"), 7));
        }
        let word = |i: u64| {
            let at = 8 + i * ptr_size;
            read(data, at, ptr_size).ok_or_else(|| malformed("truncated", at))
        };
        let nfunc = word(0)?;
        let (text_start, names, pcln) = if go118 {
            let start = match word(2)? {
                0 => text,
                start => start,
            };
            (start, 3, 7)
        } else {
            (0, 2, 6)
        };
        Ok(Header {
            magic,
            ptr_size,
            nfunc,
            text_start,
            funcnames: word(names)?,
            funcnames_end: word(names + 1)?,
            functab: word(pcln)?,
        })
    }

    /// How many functions the table lists.
    pub fn nfunc(&self) -> u64 {
        self.nfunc
    }

    /// Whether the first function's `_func` repeats its functab entry, as in every table Go
    /// writes; `functab` is the region from the functab to the end of the table.
    pub fn first_entry_agrees(&self, functab: &mut Window<'_>) -> Result<bool, Problem> {
        let field = self.field();
        let (Some(entry), Some(funcoff)) = (functab.uint(0, field)?, functab.uint(field, field)?) else {
            return Ok(false);
        };
        Ok(functab.uint(funcoff, field)? == Some(entry))
    }

    /// The functab's field size: u32 from Go 1.18, pointer-sized before.
    fn field(&self) -> u64 {
        if self.magic == GO116 {
            self.ptr_size
        } else {
            4
        }
    }
}

/// A function found in the table: its name, entry address, and end (the next one's entry).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Located {
    pub name: String,
    pub entry: u64,
    pub end: u64,
}

/// The functions whose names `wanted` accepts, in table (address) order. `names` is the region
/// of the table from `header.funcnames` to `header.funcnames_end`; `functab` the region from
/// `header.functab` to the end of the table.
///
/// Two passes, each reading its region once, front to back, a chunk at a time: the names are
/// scanned for the offsets of the wanted ones (the linker writes each name once; only the
/// accepted names are kept), then the functab and the `_func`s it points at (in the same order)
/// for the functions named there.
pub fn find(
    header: &Header,
    names: &mut Window<'_>,
    functab: &mut Window<'_>,
    wanted: &dyn Fn(&str) -> bool,
) -> Result<Vec<Located>, Problem> {
    let offsets = name_offsets(names, wanted)?;
    if offsets.is_empty() {
        return Ok(Vec::new());
    }
    // The functab and the `_func`s are in the same region, far apart: one window each.
    let mut funcs = Window::new(
        functab.image(),
        functab.file_offset(0),
        functab.size(),
        ".gopclntab _func",
    );
    let field = header.field();
    let malformed = |what: String, at: u64| Problem::Malformed {
        what: format!(".gopclntab {what}"),
        offset: at,
    };
    let mut field_at = |at: u64| -> Result<u64, Problem> {
        functab
            .uint(at, field)?
            .ok_or_else(|| malformed("functab truncated".into(), functab.file_offset(at)))
    };
    let mut found = Vec::new();
    let mut previous = 0;
    for i in 0..header.nfunc {
        let funcoff = field_at((2 * i + 1) * field)?;
        // The linker writes the `_func`s in functab order; holding to it keeps a damaged table
        // from making the window read the region over and over.
        if funcoff < previous {
            return Err(malformed(
                format!("functab: _func of function {i} at {funcoff:#x} is before the previous one's"),
                functab.file_offset((2 * i + 1) * field),
            ));
        }
        previous = funcoff;
        // `_func.nameoff` follows `entryoff` (u32) or `entry` (pointer-sized).
        let nameoff = funcs.uint(funcoff + field, 4)?.ok_or_else(|| {
            malformed(
                format!("_func of function {i} out of the table"),
                funcs.file_offset(funcoff),
            )
        })?;
        // A few wanted names against every function: a scan, cheaper than hashing each.
        let Some((_, name)) = offsets.iter().find(|(off, _)| *off == nameoff) else {
            continue;
        };
        let start = header.text_start + field_at(2 * i * field)?;
        let end = header.text_start + field_at(2 * (i + 1) * field)?;
        if end <= start {
            return Err(malformed(
                format!("functab: function {i} ends at {end:#x}, not after its entry {start:#x}"),
                functab.file_offset(2 * i * field),
            ));
        }
        // The `_func` repeats the entry: a cheap check that the layout was read right.
        let own = funcs.uint(funcoff, field)?.map(|raw| {
            raw + if header.magic == GO116 {
                0
            } else {
                header.text_start
            }
        });
        if own != Some(start) {
            return Err(malformed(
                format!("_func of function {i} has entry {own:#x?}, the functab {start:#x}"),
                funcs.file_offset(funcoff),
            ));
        }
        found.push(Located {
            name: name.clone(),
            entry: start,
            end,
        });
    }
    Ok(found)
}

/// Where in the names region each name that `wanted` accepts starts (the `nameoff` a `_func`
/// holds). Names that are not UTF-8 are not offered to `wanted`.
fn name_offsets(
    names: &mut Window<'_>,
    wanted: &dyn Fn(&str) -> bool,
) -> Result<Vec<(u64, String)>, Problem> {
    let mut offsets = Vec::new();
    let mut pos = 0;
    while pos < names.size() {
        let len = CHUNK.min(names.size() - pos);
        let chunk = names.get(pos, len)?.expect("within the region");
        let used = names_in(chunk, wanted, |at, name| {
            offsets.push((pos + at as u64, name.to_owned()))
        });
        if used == 0 {
            if pos + len == names.size() {
                break; // Padding after the last name.
            }
            return Err(Problem::Malformed {
                what: format!(".gopclntab function name longer than {CHUNK} bytes"),
                offset: names.file_offset(pos),
            });
        }
        pos += used as u64;
    }
    Ok(offsets)
}

/// Offers `found` every NUL-terminated name in `chunk` that `wanted` accepts, with where it
/// starts; returns how many bytes the names took (the chunk up to its last NUL). They are
/// checked as UTF-8 all at once (a NUL ends a character too), one by one only if that fails:
/// one by one, ~70,000 names (the client-go informer's) were half of the scan, 1.5 of 2.7 ms.
fn names_in(chunk: &[u8], wanted: &dyn Fn(&str) -> bool, mut found: impl FnMut(usize, &str)) -> usize {
    let whole = memchr::memrchr(0, chunk).map_or(&[][..], |last| &chunk[..=last]);
    let text = std::str::from_utf8(whole).ok();
    let mut used = 0;
    while let Some(nul) = memchr::memchr(0, &whole[used..]) {
        let name = match text {
            Some(text) => Some(&text[used..used + nul]),
            None => std::str::from_utf8(&whole[used..used + nul]).ok(),
        };
        if let Some(name) = name.filter(|name| wanted(name)) {
            found(used, name);
        }
        used += nul + 1;
    }
    used
}

/// A little-endian unsigned integer of `size` (4 or 8) bytes at `at`, if `data` holds it.
fn read(data: &[u8], at: u64, size: u64) -> Option<u64> {
    let at = usize::try_from(at).ok()?;
    let bytes = data.get(at..at.checked_add(size as usize)?)?;
    let mut buf = [0u8; 8];
    buf[..bytes.len()].copy_from_slice(bytes);
    Some(u64::from_le_bytes(buf))
}

#[cfg(test)]
mod tests {
    use super::names_in;

    fn scan(chunk: &[u8]) -> (Vec<(usize, String)>, usize) {
        let mut found = Vec::new();
        let used = names_in(chunk, &|name| name.ends_with(".Read"), |at, name| {
            found.push((at, name.to_owned()))
        });
        (found, used)
    }

    #[test]
    fn names_are_found_where_they_start_up_to_the_last_whole_one() {
        let chunk = b"runtime.main\0crypto/tls.(*Conn).Read\0os.(*File).Read\0net/http.(*Cli";
        let (found, used) = scan(chunk);
        assert_eq!(
            found,
            [
                (13, "crypto/tls.(*Conn).Read".to_string()),
                (37, "os.(*File).Read".to_string())
            ]
        );
        // The cut name is left for the next chunk.
        assert_eq!(used, 53);
        assert_eq!(scan(b"no NUL at all"), (vec![], 0));
    }

    #[test]
    fn a_name_that_is_not_utf8_is_passed_over_and_its_neighbours_still_found() {
        let chunk = b"a.Read\0bad\xff.Read\0\xe2\x82.Read\0b.Read\0";
        let (found, used) = scan(chunk);
        assert_eq!(found, [(0, "a.Read".to_string()), (25, "b.Read".to_string())]);
        assert_eq!(used, chunk.len());
    }
}
