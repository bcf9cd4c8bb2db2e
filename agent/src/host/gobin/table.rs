//! Where `.gopclntab` is. The Go linker writes it as its own section, `.gopclntab`, or
//! `.data.rel.ro.gopclntab` in a position-independent executable it links itself; when an
//! external linker links a PIE (cgo, `-linkmode=external`), that section is merged into
//! `.data.rel.ro` and a stripped binary has nothing that names it. Then the table is found as Go
//! tools outside the toolchain find it: by scanning `.data.rel.ro` for a header (a known magic,
//! PC quantum 1 and 8-byte pointers at an 8-byte aligned address) whose offsets fit and whose
//! first function's `_func` repeats its entry.
use crate::host::gobin::image::{Image, Section};
use crate::host::gobin::pclntab::{Header, HEADER_LEN};
use crate::host::gobin::window::{Window, CHUNK};
use crate::host::gobin::Problem;

/// The sections the Go linker names for the table.
const NAMED: [&str; 2] = [".gopclntab", ".data.rel.ro.gopclntab"];
/// Where an external linker puts it.
const MERGED: &str = ".data.rel.ro";

/// Where the table is: its file offset and virtual address, and how far it may extend (the end
/// of its section).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Table {
    pub offset: u64,
    pub address: u64,
    pub size: u64,
}

/// The table of the binary in `image`, or [`Problem::NotGo`].
pub fn find(image: &Image) -> Result<Table, Problem> {
    if let Some(section) = NAMED.iter().find_map(|name| image.section(name)) {
        return Ok(Table {
            offset: section.offset,
            address: section.address,
            size: section.size,
        });
    }
    let found = match image.section(MERGED) {
        Some(section) => scan(image, section)?,
        None => None,
    };
    found.ok_or_else(not_go)
}

fn not_go() -> Problem {
    Problem::NotGo(".gopclntab section nor a pclntab in .data.rel.ro")
}

/// The first plausible table in `section`.
fn scan(image: &Image, section: Section) -> Result<Option<Table>, Problem> {
    let mut window = Window::new(image, section.offset, section.size, MERGED);
    // Offsets in the section whose address is 8-byte aligned; chunks start on one.
    let mut pos = (8 - section.address % 8) % 8;
    while pos < section.size {
        let len = CHUNK.min(section.size - pos);
        let chunk = window.get(pos, len)?.expect("within the section");
        let mut at = 0;
        while at + 8 <= chunk.len() {
            let candidate = &chunk[at..at + 8];
            at += 8;
            let magic = u32::from_le_bytes([candidate[0], candidate[1], candidate[2], candidate[3]]);
            if !matches!(magic, 0xffff_fff0 | 0xffff_fff1 | 0xffff_fffa) || candidate[4..] != [0, 0, 1, 8] {
                continue;
            }
            let offset = pos + at as u64 - 8;
            let table = Table {
                offset: section.offset + offset,
                address: section.address + offset,
                size: section.size - offset,
            };
            if plausible(image, table)? {
                return Ok(Some(table));
            }
        }
        pos += len;
    }
    Ok(None)
}

/// Whether a header at `table` describes a table that fits in it and agrees with itself.
fn plausible(image: &Image, table: Table) -> Result<bool, Problem> {
    let head = image.read_at(table.offset, table.size.min(HEADER_LEN), MERGED)?;
    let Ok(header) = Header::parse(&head, table.offset, 0) else {
        return Ok(false);
    };
    if header.nfunc() == 0
        || header.funcnames >= header.funcnames_end
        || header.funcnames_end > header.functab
        || header.functab >= table.size
    {
        return Ok(false);
    }
    let mut functab = Window::new(
        image,
        table.offset + header.functab,
        table.size - header.functab,
        MERGED,
    );
    header.first_entry_agrees(&mut functab)
}
