//! The ELF file as the reader needs it: its x86-64 check, the few sections a Go binary is read
//! through, its PT_LOAD segments (virtual address to file offset), its dynamic symbols on
//! demand (a shared library's exports, `host/sslbin.rs`), and reads of byte ranges at file
//! offsets. Only the ELF headers and symbol tables go through `object` (with a `ReadCache`, so
//! the file is never read whole); section contents are read with `pread` so that I/O errors
//! keep their cause.
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use object::read::elf::ElfFile64;
use object::{
    Architecture, Endianness, FileKind, Object, ObjectSection, ObjectSegment, ObjectSymbol, ReadCache,
};

use crate::host::gobin::Problem;

/// The sections the reader looks for; the others are not kept.
const KEPT: [&str; 6] = [
    ".gopclntab",
    ".data.rel.ro.gopclntab",
    ".data.rel.ro",
    ".go.buildinfo",
    ".text",
    crate::host::gobin::moduledata::SECTION,
];

/// A section with contents in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Section {
    pub name: &'static str,
    pub address: u64,
    pub offset: u64,
    pub size: u64,
}

/// A PT_LOAD segment: `filesz` bytes at `offset` in the file are mapped at `vaddr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Segment {
    vaddr: u64,
    offset: u64,
    filesz: u64,
}

/// An open x86-64 ELF file with its section and segment tables (a few hundred bytes).
#[derive(Debug)]
pub struct Image {
    file: File,
    sections: Vec<Section>,
    segments: Vec<Segment>,
}

/// The ELF headers of the file `cache` reads, parsed (every read through the cache), with the
/// one error for headers that do not parse.
fn headers<'a>(
    cache: &'a ReadCache<&'a File>,
) -> Result<ElfFile64<'a, Endianness, &'a ReadCache<&'a File>>, Problem> {
    ElfFile64::parse(cache).map_err(|e| Problem::Malformed {
        what: format!("ELF headers ({e})"),
        offset: 0,
    })
}

impl Image {
    /// Opens `path` and reads its ELF headers; fails unless it is a 64-bit x86-64 ELF file.
    pub fn open(path: &Path) -> Result<Image, Problem> {
        let file = File::open(path)?;
        let (sections, segments) = {
            let cache = ReadCache::new(&file);
            match FileKind::parse(&cache) {
                Ok(FileKind::Elf64) => {}
                Ok(FileKind::Elf32) => return Err(Problem::NotX86_64("a 32-bit ELF file".into())),
                _ => return Err(Problem::NotElf),
            }
            let elf = headers(&cache)?;
            if elf.architecture() != Architecture::X86_64 {
                return Err(Problem::NotX86_64(format!("{:?}", elf.architecture())));
            }
            let mut sections = Vec::new();
            for section in elf.sections() {
                let Ok(name) = section.name() else { continue };
                let (Some(kept), Some((offset, size))) =
                    (KEPT.iter().find(|k| **k == name), section.file_range())
                else {
                    continue;
                };
                sections.push(Section {
                    name: kept,
                    address: section.address(),
                    offset,
                    size,
                });
            }
            let segments = elf
                .segments()
                .map(|s| {
                    let (offset, filesz) = s.file_range();
                    Segment {
                        vaddr: s.address(),
                        offset,
                        filesz,
                    }
                })
                .collect();
            (sections, segments)
        };
        Ok(Image {
            file,
            sections,
            segments,
        })
    }

    /// The section named `name` (one of [`KEPT`]), if the file has it with contents.
    pub fn section(&self, name: &str) -> Option<Section> {
        self.sections.iter().copied().find(|s| s.name == name)
    }

    /// The addresses of the dynamic symbols `names` that the file defines, in their order (None
    /// where it defines no such symbol): one pass over `.dynsym`, through a cache of the reads
    /// it needs.
    pub fn dynamic_symbols<const N: usize>(&self, names: [&str; N]) -> Result<[Option<u64>; N], Problem> {
        let cache = ReadCache::new(&self.file);
        let elf = headers(&cache)?;
        let mut found = [None; N];
        for symbol in elf.dynamic_symbols().filter(|s| s.is_definition()) {
            let Ok(name) = symbol.name() else { continue };
            if let Some(i) = names.iter().position(|n| *n == name) {
                found[i] = Some(symbol.address());
            }
        }
        Ok(found)
    }

    /// The file offset where the byte at virtual address `vaddr` is stored, with how many bytes
    /// from there on the same segment holds in the file.
    pub fn file_offset(&self, vaddr: u64) -> Option<(u64, u64)> {
        self.segments.iter().find_map(|s| {
            let delta = vaddr.checked_sub(s.vaddr)?;
            (delta < s.filesz).then(|| (s.offset + delta, s.filesz - delta))
        })
    }

    /// `len` bytes at file offset `offset`; `what` names them if the file is too short.
    pub fn read_at(&self, offset: u64, len: u64, what: &str) -> Result<Vec<u8>, Problem> {
        let mut buf = Vec::new();
        self.read_into(offset, len, what, &mut buf)?;
        buf.truncate(len as usize);
        Ok(buf)
    }

    /// [`read_at`](Self::read_at) into the first `len` bytes of `buf`, which grows if it must
    /// and keeps its allocation and any bytes past `len`: a window that reads a table a chunk
    /// at a time pays no fresh pages, and no zeroing, per chunk.
    pub fn read_into(&self, offset: u64, len: u64, what: &str, buf: &mut Vec<u8>) -> Result<(), Problem> {
        let malformed = || Problem::Malformed {
            what: format!("{what}: {len} bytes past the end of the file"),
            offset,
        };
        let size = usize::try_from(len).map_err(|_| malformed())?;
        if buf.len() < size {
            // Zeroed by the allocator, not byte by byte.
            *buf = vec![0; size];
        }
        self.file.read_exact_at(&mut buf[..size], offset).map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                malformed()
            } else {
                Problem::Io(e)
            }
        })
    }

    /// `len` bytes mapped at virtual address `vaddr`, all within one segment's file contents.
    pub fn read_vaddr(&self, vaddr: u64, len: u64, what: &str) -> Result<Vec<u8>, Problem> {
        match self.file_offset(vaddr) {
            Some((offset, left)) if left >= len => self.read_at(offset, len, what),
            _ => Err(Problem::Unmapped {
                what: format!("{what} ({len} bytes)"),
                vaddr,
            }),
        }
    }
}
