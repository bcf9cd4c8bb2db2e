//! Where Go's code starts when `.gopclntab` does not say. The functab's entries are offsets
//! from `runtime.text`; up to Go 1.25 the table's header held that address, but Go 1.26 stopped
//! storing it there ("it requires a relocation": the word is 0), and the runtime reads it from
//! its `moduledata` instead, which the linker puts in a section of its own, `.go.module`
//! (`cmd/link/internal/ld/data.go`). Go's `.text` section starts with `runtime.text` when Go
//! links the binary itself, but not when a C linker does (cgo, `-linkmode=external`, Debian's
//! kubectl 1.36): its C start-up code comes first (0x100 bytes there), and uprobes placed
//! from `.text` would land inside other instructions.
//!
//! `moduledata` (`runtime/symtab.go`, the same prefix from Go 1.16 to 1.27): `pcHeader`, six
//! slices (`funcnametab`, `cutab`, `filetab`, `pctab`, `pclntable`, `ftab`), `findfunctab`,
//! `minpc`, `maxpc`, `text`, `etext`: `text` is word 22. Its words hold addresses only if the
//! file carries them (a C linker writes them, the Go linker of a PIE leaves 0 for the dynamic
//! loader): the `pcHeader` word must be the table's address, and `text` must bound `minpc`.
use crate::host::gobin::image::Image;
use crate::host::gobin::Problem;

/// The section Go 1.26+ puts `moduledata` in.
pub const SECTION: &str = ".go.module";
/// Words of `moduledata` read: up to `etext`.
const WORDS: usize = 24;
const PC_HEADER: usize = 0;
const MINPC: usize = 20;
const MAXPC: usize = 21;
const TEXT: usize = 22;

/// `runtime.text` from `.go.module`, if the binary has that section and its `moduledata`
/// describes the table at virtual address `table` with addresses filled in; None otherwise.
pub fn text(image: &Image, table: u64) -> Result<Option<u64>, Problem> {
    let Some(section) = image.section(SECTION) else {
        return Ok(None);
    };
    if section.size < (WORDS * 8) as u64 {
        return Ok(None);
    }
    let data = image.read_at(section.offset, (WORDS * 8) as u64, SECTION)?;
    let word = |i: usize| u64::from_le_bytes(data[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
    if word(PC_HEADER) != table {
        return Ok(None);
    }
    let (minpc, maxpc, text) = (word(MINPC), word(MAXPC), word(TEXT));
    if text == 0 || minpc < text || maxpc <= minpc {
        return Err(Problem::Malformed {
            what: format!("{SECTION}: moduledata has text {text:#x}, minpc {minpc:#x}, maxpc {maxpc:#x}"),
            offset: section.offset,
        });
    }
    Ok(Some(text))
}
