//! A region of the file read through one buffer of at most [`CHUNK`] bytes at a time, for
//! `.gopclntab`'s name and function tables (12 to 13 MB each in kubelet), which are scanned
//! front to back and need not be held whole.
use crate::host::gobin::image::Image;
use crate::host::gobin::Problem;

/// How much is read at once.
pub const CHUNK: u64 = 1 << 20;

/// `size` bytes at file offset `offset`, read a chunk at a time as they are asked for.
pub struct Window<'a> {
    image: &'a Image,
    offset: u64,
    size: u64,
    what: &'static str,
    /// Its first `held` bytes are the region's from `at` on.
    buf: Vec<u8>,
    held: usize,
    /// Where in the region `buf` starts.
    at: u64,
}

impl<'a> Window<'a> {
    /// The region; nothing is read yet. `what` names it in errors.
    pub fn new(image: &'a Image, offset: u64, size: u64, what: &'static str) -> Window<'a> {
        Window {
            image,
            offset,
            size,
            what,
            buf: Vec::new(),
            held: 0,
            at: 0,
        }
    }

    pub fn image(&self) -> &'a Image {
        self.image
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// The file offset of `at` in the region, for errors.
    pub fn file_offset(&self, at: u64) -> u64 {
        self.offset + at
    }

    /// The `len` (at most [`CHUNK`]) bytes at `at` in the region, or `None` past its end.
    /// Reads the chunk from `at` on unless the buffer already holds them.
    pub fn get(&mut self, at: u64, len: u64) -> Result<Option<&[u8]>, Problem> {
        let Some(end) = at.checked_add(len).filter(|end| *end <= self.size) else {
            return Ok(None);
        };
        if at < self.at || end > self.at + self.held as u64 {
            let n = CHUNK.max(len).min(self.size - at);
            self.held = 0;
            self.image
                .read_into(self.offset + at, n, self.what, &mut self.buf)?;
            self.held = n as usize;
            self.at = at;
        }
        let start = (at - self.at) as usize;
        Ok(Some(&self.buf[start..start + len as usize]))
    }

    /// A little-endian unsigned integer of `size` (4 or 8) bytes at `at`, or `None` past the
    /// end of the region.
    pub fn uint(&mut self, at: u64, size: u64) -> Result<Option<u64>, Problem> {
        Ok(self.get(at, size)?.map(|bytes| {
            let mut buf = [0u8; 8];
            buf[..bytes.len()].copy_from_slice(bytes);
            u64::from_le_bytes(buf)
        }))
    }
}
