//! Reading and writing plan files.
//!
//! [`PlanFile::open`] keeps the file open and reads it with positional reads
//! (`read_at`, `seek_read` on Windows), after checking that the path is a
//! regular file (a FIFO would block, a directory or a device is refused
//! with a clear error): the preamble and header at once, the data region in
//! parallel chunks to check its checksum, and each section only when it is
//! asked for ([`PlanFile::read_section`] into memory the caller owns,
//! [`PlanFile::section_bytes`] for small ones). A file cut short is
//! [`PlanError::Truncated`]; one that shrinks *while* it is read is
//! [`PlanError::Changed`], an error naming the file, never a fault (a map of
//! the file, as before, died with SIGBUS there), and
//! [`PlanFile::check_unchanged`] catches one rewritten in place. Reading
//! costs about what mapping did: `gerbil-run bench` (debug build, busy
//! 2-core machine, medians of 3) loaded the 274 MB SmolLM2-135M plan in
//! 1295 ms read against 1466 mapped, the open with its checksum taking
//! 111 ms against 61 and the weight upload 828 against 959
//! (docs/plan-format.md); reading the whole file into one fresh `Vec` had
//! cost 647 ms against 463 (release), for page-faulting the allocation,
//! which the chunked reads into reused buffers avoid.
//! [`PlanFile::from_bytes`] reads a plan already in memory, and
//! [`PlanFile::from_source`] one behind any [`PlanSource`] of positional
//! reads: that is how a browser loads a plan without holding it in wasm
//! memory (a Web Worker's synchronous reads of a file in the Origin Private
//! File System, or of the `File` a user picked; wasm32 has no positional
//! reads of its own, so `open` reads the file into memory there). All of
//! them run the same checks and report the same [`PlanError`]s.
//!
//! Writing: [`write_plan`] writes a [`DataLayout`] whose sections are all
//! in memory; [`write_plan_streaming`] writes one whose sections were
//! [reserved](DataLayout::reserve) by length only, asking for each one's
//! bytes as it reaches it and dropping them once written, so a plan's data
//! (the compiler's weights) never sits in memory whole. The header, which
//! holds every section's offset, goes first either way; the data checksum,
//! which the preamble holds, is known only at the end, so the preamble is
//! written with a zero there and patched last (the temporary file is
//! seekable): both writers give the same bytes.

use crate::header::{PlanHeader, SectionRef};
use std::borrow::Cow;
#[cfg(not(target_arch = "wasm32"))]
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The first 8 bytes of every plan file.
pub const MAGIC: [u8; 8] = *b"GERBPLAN";
/// The format version this build reads and writes.
pub const FORMAT_VERSION: u32 = 2;
/// Alignment of the data region and of every section in it.
pub const SECTION_ALIGN: u64 = 256;
const PREAMBLE_LEN: u64 = 48;

/// Why a plan file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// The file could not be opened, read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file does not start with the plan magic.
    #[error("{0}: not a gerbil plan (wrong magic bytes); compile one with `gerbilc compile`")]
    BadMagic(PathBuf),
    /// The file was written by an incompatible gerbil.
    #[error("{path}: plan format version {found} is not supported (this gerbil reads version {FORMAT_VERSION}); {}", version_advice(*found))]
    Version {
        /// The file.
        path: PathBuf,
        /// Version in the file.
        found: u32,
    },
    /// The file is shorter than its preamble says.
    #[error("{path}: truncated plan file ({found} bytes, expected {expected}); it was cut short while copying or writing")]
    Truncated {
        /// The file.
        path: PathBuf,
        /// Actual length.
        found: u64,
        /// Length the preamble implies.
        expected: u64,
    },
    /// A checksum does not match.
    #[error("{path}: {what} checksum mismatch (stored {stored:08x}, computed {computed:08x}); the file is corrupt")]
    Checksum {
        /// The file.
        path: PathBuf,
        /// `header` or `data`.
        what: &'static str,
        /// CRC in the preamble.
        stored: u32,
        /// CRC of the bytes.
        computed: u32,
    },
    /// The header is not valid JSON of the expected shape.
    #[error("{path}: malformed plan header: {source}")]
    Header {
        /// The file.
        path: PathBuf,
        /// The JSON error.
        source: serde_json::Error,
    },
    /// The path is not a regular file, or the output is one of the inputs.
    #[error(transparent)]
    File(#[from] crate::safe_file::FileError),
    /// The file changed after it was opened.
    #[error("{path}: the plan file changed while it was being read ({change}); do not rewrite a plan while gerbil runs it: rerun the command")]
    Changed {
        /// The file.
        path: PathBuf,
        /// What changed: the length, or the contents in place.
        change: String,
    },
    /// A plan writer's reserved section was not given its bytes, or the
    /// wrong number of them.
    #[error("{path}: data section: {reason}; this is a bug in the program writing the plan")]
    Section {
        /// The file being written.
        path: PathBuf,
        /// Which section and what went wrong.
        reason: String,
    },
    /// The header is well-formed but inconsistent.
    #[error("{path}: inconsistent plan: {reason}; the file was edited or damaged: recompile it with `gerbilc compile`")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is inconsistent.
        reason: String,
    },
}

/// What to do about a plan of format version `found`: a newer gerbil wrote
/// it (upgrade the runtime), or an older one did (recompile it).
fn version_advice(found: u32) -> &'static str {
    if found > FORMAT_VERSION {
        "a newer gerbil wrote it: upgrade gerbil-run, or recompile the model with this gerbilc"
    } else {
        "an older gerbil wrote it: recompile the model with this gerbilc (`gerbilc compile`)"
    }
}

/// Bytes of one data section, borrowed (e.g. from a plan in memory) or owned.
pub type SectionData<'a> = Cow<'a, [u8]>;

/// Positional reads of a plan's bytes that live neither in a local file nor
/// in memory: in a browser, a Web Worker's `FileSystemSyncAccessHandle` (the
/// Origin Private File System) or `FileReaderSync` over a user's `File`.
/// [`PlanFile::from_source`] reads the preamble and header through it, the
/// data region once for its checksum (a megabyte at a time), and afterwards
/// only the sections asked for.
pub trait PlanSource: Send + Sync {
    /// The plan's length in bytes.
    fn size(&self) -> u64;
    /// Fills `buf` with the bytes at `at` (which lie inside [`PlanSource::size`]).
    fn read_exact_at(&self, at: u64, buf: &mut [u8]) -> std::io::Result<()>;
}

/// Where a plan's bytes are: an open file, read with positional reads when
/// needed, a buffer in memory, or a [`PlanSource`].
enum PlanBytes {
    #[cfg(not(target_arch = "wasm32"))]
    File {
        file: File,
        /// Length when opened.
        len: u64,
        /// Modification time when opened, where the OS keeps one.
        modified: Option<std::time::SystemTime>,
    },
    Owned(Vec<u8>),
    Source(Box<dyn PlanSource>),
}

/// Bytes a thread reads and hashes at a time while checking the data
/// checksum of a file (small enough to stay in cache between the two).
const CRC_READ: usize = 1 << 20;

impl PlanBytes {
    fn len(&self) -> u64 {
        match self {
            #[cfg(not(target_arch = "wasm32"))]
            PlanBytes::File { len, .. } => *len,
            PlanBytes::Owned(bytes) => bytes.len() as u64,
            PlanBytes::Source(source) => source.size(),
        }
    }

    /// Fills `buf` with the bytes at `at`. A file that has become shorter
    /// since it was opened is [`PlanError::Changed`].
    fn read_at(&self, path: &Path, at: u64, buf: &mut [u8]) -> Result<(), PlanError> {
        let end = at
            .checked_add(buf.len() as u64)
            .filter(|&e| e <= self.len());
        let Some(end) = end else {
            return Err(PlanError::Truncated {
                path: path.to_path_buf(),
                found: self.len(),
                expected: at.saturating_add(buf.len() as u64),
            });
        };
        match self {
            #[cfg(not(target_arch = "wasm32"))]
            PlanBytes::File { file, len, .. } => {
                use positioned_io::ReadAt;
                match file.read_exact_at(at, buf) {
                    Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                        let found = file.metadata().map_or(at, |m| m.len());
                        Err(PlanError::Changed {
                            path: path.to_path_buf(),
                            change: format!("now {found} bytes, was {len}"),
                        })
                    }
                    read => read.map_err(io_err(path)),
                }
            }
            PlanBytes::Owned(bytes) => {
                buf.copy_from_slice(&bytes[at as usize..end as usize]);
                Ok(())
            }
            PlanBytes::Source(source) => source.read_exact_at(at, buf).map_err(io_err(path)),
        }
    }

    /// The CRC-32 of `len` bytes at `at`, which lie inside [`PlanBytes::len`].
    fn crc(&self, path: &Path, at: u64, len: u64) -> Result<u32, PlanError> {
        let read = |start: u64, end: u64| {
            let mut h = crc32fast::Hasher::new();
            let mut buf = vec![0u8; CRC_READ.min((end - start) as usize)];
            let mut pos = start;
            while pos < end {
                let n = CRC_READ.min((end - pos) as usize);
                self.read_at(path, pos, &mut buf[..n])?;
                h.update(&buf[..n]);
                pos += n as u64;
            }
            Ok::<_, PlanError>(h)
        };
        match self {
            #[cfg(not(target_arch = "wasm32"))]
            PlanBytes::File { .. } => parallel_crc(at, len, read),
            PlanBytes::Owned(bytes) => Ok(crc32(&bytes[at as usize..(at + len) as usize])),
            // One reader: a source need not serve several threads at once.
            PlanBytes::Source(_) => Ok(read(at, at + len)?.finalize()),
        }
    }
}

/// An opened, checked plan file.
pub struct PlanFile {
    path: PathBuf,
    bytes: PlanBytes,
    data_offset: u64,
    /// The decoded header.
    pub header: PlanHeader,
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> PlanError + '_ {
    move |source| PlanError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn align_up(n: u64) -> u64 {
    n.div_ceil(SECTION_ALIGN) * SECTION_ALIGN
}

/// A section of the data region: its bytes, or only its length, the bytes
/// to come from the writer's `fill` when the section is written.
enum Section<'a> {
    Bytes(SectionData<'a>),
    Reserved(u64),
}

impl Section<'_> {
    fn len(&self) -> u64 {
        match self {
            Section::Bytes(bytes) => bytes.len() as u64,
            Section::Reserved(len) => *len,
        }
    }
}

/// Lays out sections in the data region: each call returns where the bytes go.
#[derive(Default)]
pub struct DataLayout<'a> {
    sections: Vec<(u64, Section<'a>)>,
    len: u64,
}

impl<'a> DataLayout<'a> {
    /// Appends a section; returns its place.
    pub fn push(&mut self, bytes: SectionData<'a>) -> SectionRef {
        self.add(Section::Bytes(bytes))
    }

    /// Appends a section of `len` bytes that are made only when the plan is
    /// written, by [`write_plan_streaming`]'s `fill` (the first reserved
    /// section is its index 0); returns its place.
    pub fn reserve(&mut self, len: u64) -> SectionRef {
        self.add(Section::Reserved(len))
    }

    fn add(&mut self, section: Section<'a>) -> SectionRef {
        let offset = align_up(self.len);
        let len = section.len();
        self.sections.push((offset, section));
        self.len = offset + len;
        SectionRef { offset, len }
    }

    /// Total length of the data region.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether no section was pushed.
    pub fn is_empty(&self) -> bool {
        self.sections.is_empty()
    }
}

/// Writes a plan: preamble, header, then the data sections, through
/// [`crate::safe_file::write_file_with`] (a synced temporary file renamed
/// over `path` only when complete; on an error the old `path` is kept).
/// Every section must have its bytes ([`DataLayout::push`]); a layout with
/// reserved sections is written by [`write_plan_streaming`].
pub fn write_plan(
    path: &Path,
    header: &PlanHeader,
    data: &DataLayout<'_>,
) -> Result<(), PlanError> {
    write_plan_with_progress(path, header, data, &mut |_, _| {})
}

/// Bytes of a section written between two calls of a progress callback.
const PROGRESS_STEP: usize = 8 << 20;

/// Like [`write_plan`], calling `progress(done, total)` with the bytes of
/// the data region written so far (at most [`PROGRESS_STEP`] and a
/// section's alignment padding apart, counting
/// up to `total`, the data region's length; the last call has `done ==
/// total`), for a progress bar.
pub fn write_plan_with_progress(
    path: &Path,
    header: &PlanHeader,
    data: &DataLayout<'_>,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(), PlanError> {
    let unfilled = |index| {
        Err(PlanError::Section {
            path: path.to_path_buf(),
            reason: format!("reserved section {index} was given no bytes (write_plan_streaming fills reserved sections)"),
        })
    };
    write_plan_streaming(path, header, data, unfilled, progress)
}

/// Offset in the file of the data region's CRC-32, the preamble's last field.
const DATA_CRC_AT: u64 = PREAMBLE_LEN - 4;

/// [`write_plan_with_progress`] of a layout with reserved sections: the
/// bytes of the `k`-th reserved section are `fill(k)`, asked for when the
/// section is written and dropped once written, so the data region never
/// sits in memory as a whole. The preamble goes out with a zero data
/// checksum, which is filled in once the last section is written (the file
/// is the same, byte for byte, as [`write_plan`] of the same bytes). The
/// first error of `fill` stops the write and is returned as it is (the
/// temporary file is removed, `path` left as it was); `fill` giving a
/// number of bytes other than reserved is a [`PlanError::Section`].
pub fn write_plan_streaming<'s, E: From<PlanError>>(
    path: &Path,
    header: &PlanHeader,
    data: &DataLayout<'_>,
    mut fill: impl FnMut(usize) -> Result<SectionData<'s>, E>,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(), E> {
    let header_json = serde_json::to_vec(header).map_err(|source| PlanError::Header {
        path: path.to_path_buf(),
        source,
    })?;
    let data_offset = align_up(PREAMBLE_LEN + header_json.len() as u64);
    let preamble = preamble(&header_json, data_offset, data.len);
    let mut failed: Option<E> = None;
    let mut section = |k: usize, len: u64| -> std::io::Result<SectionData<'s>> {
        let sized = fill(k).and_then(|bytes| {
            if bytes.len() as u64 == len {
                return Ok(bytes);
            }
            Err(E::from(PlanError::Section {
                path: path.to_path_buf(),
                reason: format!(
                    "reserved section {k} was reserved for {len} bytes but given {}",
                    bytes.len()
                ),
            }))
        });
        sized.map_err(|e| {
            failed = Some(e);
            std::io::Error::other("a data section could not be made")
        })
    };
    let write_all = |w: &mut dyn crate::safe_file::WriteSeek| -> std::io::Result<()> {
        w.write_all(&preamble)?;
        w.write_all(&header_json)?;
        let header_pad = data_offset - PREAMBLE_LEN - header_json.len() as u64;
        w.write_all(&vec![0u8; header_pad as usize])?;
        let crc = write_sections(w, data, &mut section, progress)?;
        w.seek(std::io::SeekFrom::Start(DATA_CRC_AT))?;
        w.write_all(&crc.to_le_bytes())?;
        w.flush()
    };
    match crate::safe_file::write_file_seekable(path, write_all) {
        Ok(()) => Ok(()),
        Err(e) => Err(failed.unwrap_or_else(|| PlanError::from(e).into())),
    }
}

/// The 48-byte preamble, its data checksum zero (see [`DATA_CRC_AT`]).
fn preamble(header_json: &[u8], data_offset: u64, data_len: u64) -> Vec<u8> {
    let mut pre = Vec::with_capacity(PREAMBLE_LEN as usize);
    pre.extend_from_slice(&MAGIC);
    pre.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    pre.extend_from_slice(&0u32.to_le_bytes());
    pre.extend_from_slice(&(header_json.len() as u64).to_le_bytes());
    pre.extend_from_slice(&data_offset.to_le_bytes());
    pre.extend_from_slice(&data_len.to_le_bytes());
    pre.extend_from_slice(&crc32fast::hash(header_json).to_le_bytes());
    pre.extend_from_slice(&0u32.to_le_bytes());
    pre
}

/// Writes the data region, section after section with the zeros between
/// them, the bytes of the `k`-th reserved section from `reserved(k, len)`
/// (dropped once written); returns the region's CRC-32.
fn write_sections<'s>(
    w: &mut dyn Write,
    data: &DataLayout<'_>,
    reserved: &mut dyn FnMut(usize, u64) -> std::io::Result<SectionData<'s>>,
    progress: &mut dyn FnMut(u64, u64),
) -> std::io::Result<u32> {
    let zeros = [0u8; SECTION_ALIGN as usize];
    let mut crc = crc32fast::Hasher::new();
    let mut pos = 0u64;
    let mut next_reserved = 0;
    let mut reported = None;
    for (offset, section) in &data.sections {
        let pad = &zeros[..(offset - pos) as usize];
        w.write_all(pad)?;
        crc.update(pad);
        let bytes = match section {
            Section::Bytes(bytes) => Cow::Borrowed(&bytes[..]),
            Section::Reserved(len) => {
                next_reserved += 1;
                reserved(next_reserved - 1, *len)?
            }
        };
        for (k, piece) in bytes.chunks(PROGRESS_STEP).enumerate() {
            w.write_all(piece)?;
            crc.update(piece);
            let done = offset + (k * PROGRESS_STEP + piece.len()) as u64;
            progress(done, data.len);
            reported = Some(done);
        }
        pos = offset + bytes.len() as u64;
    }
    if reported != Some(data.len) {
        progress(data.len, data.len);
    }
    Ok(crc.finalize())
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// Bytes per thread below which [`parallel_crc`] hashes on the calling thread.
const CRC_CHUNK: usize = 64 << 20;

/// The CRC-32 of `bytes` (see [`parallel_crc`]).
fn crc32(bytes: &[u8]) -> u32 {
    let hashed = parallel_crc(0, bytes.len() as u64, |start, end| {
        let mut h = crc32fast::Hasher::new();
        h.update(&bytes[start as usize..end as usize]);
        Ok::<_, std::convert::Infallible>(h)
    });
    match hashed {
        Ok(crc) => crc,
        Err(never) => match never {},
    }
}

/// The CRC-32 of bytes `at..at + len`, hashed by `hash(start, end)` in
/// parallel parts of at least [`CRC_CHUNK`] bytes combined in order (a
/// 2.5 GB plan's data took 250 ms on one thread — a quarter of a 1B model's
/// start-up). The first error of any part is returned.
fn parallel_crc<E: Send>(
    at: u64,
    len: u64,
    hash: impl Fn(u64, u64) -> Result<crc32fast::Hasher, E> + Sync,
) -> Result<u32, E> {
    #[cfg(not(target_arch = "wasm32"))]
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    #[cfg(target_arch = "wasm32")]
    let threads = 1u64;
    let threads = threads.min(len.div_ceil(CRC_CHUNK as u64)).max(1);
    let part = len.div_ceil(threads).max(1);
    let end = at + len;
    let range = |k: u64| ((at + k * part).min(end), (at + (k + 1) * part).min(end));
    let parts: Vec<Result<crc32fast::Hasher, E>> = if threads == 1 {
        vec![hash(at, end)]
    } else {
        std::thread::scope(|scope| {
            let handles: Vec<_> = (0..threads)
                .map(|k| {
                    let (start, end) = range(k);
                    let hash = &hash;
                    scope.spawn(move || hash(start, end))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        })
    };
    let mut total = crc32fast::Hasher::new();
    for part in parts {
        total.combine(&part?);
    }
    Ok(total.finalize())
}

impl PlanFile {
    /// Opens and checks a plan: magic, version, lengths, both checksums, and
    /// the consistency of the header (indices and sections in range).
    pub fn open(path: &Path) -> Result<PlanFile, PlanError> {
        #[cfg(not(target_arch = "wasm32"))]
        let bytes = {
            let file = crate::safe_file::open_input(path)?;
            let meta = file.metadata().map_err(io_err(path))?;
            PlanBytes::File {
                len: meta.len(),
                modified: meta.modified().ok(),
                file,
            }
        };
        #[cfg(target_arch = "wasm32")]
        let bytes = PlanBytes::Owned(std::fs::read(path).map_err(io_err(path))?);
        PlanFile::checked(path, bytes)
    }

    /// Checks a plan that is already in memory (e.g. fetched by a browser),
    /// exactly as [`PlanFile::open`] checks a file; `name` stands for the file
    /// in errors and in [`PlanFile::path`].
    pub fn from_bytes(name: impl Into<PathBuf>, bytes: Vec<u8>) -> Result<PlanFile, PlanError> {
        PlanFile::checked(&name.into(), PlanBytes::Owned(bytes))
    }

    /// Checks a plan read through `source` (see [`PlanSource`]), exactly as
    /// [`PlanFile::open`] checks a file; `name` stands for it in errors and
    /// in [`PlanFile::path`].
    pub fn from_source(
        name: impl Into<PathBuf>,
        source: Box<dyn PlanSource>,
    ) -> Result<PlanFile, PlanError> {
        PlanFile::checked(&name.into(), PlanBytes::Source(source))
    }

    fn checked(path: &Path, bytes: PlanBytes) -> Result<PlanFile, PlanError> {
        let len = bytes.len();
        let truncated = |expected: u64| PlanError::Truncated {
            path: path.to_path_buf(),
            found: len,
            expected,
        };
        let mut pre = [0u8; PREAMBLE_LEN as usize];
        let pre = &mut pre[..len.min(PREAMBLE_LEN) as usize];
        bytes.read_at(path, 0, pre)?;
        if pre.len() < MAGIC.len() || pre[..MAGIC.len()] != MAGIC {
            if pre.len() < MAGIC.len() && MAGIC.starts_with(pre) && !pre.is_empty() {
                return Err(truncated(PREAMBLE_LEN));
            }
            return Err(PlanError::BadMagic(path.to_path_buf()));
        }
        if len < PREAMBLE_LEN {
            return Err(truncated(PREAMBLE_LEN));
        }
        let version = u32_at(pre, 8);
        if version != FORMAT_VERSION {
            return Err(PlanError::Version {
                path: path.to_path_buf(),
                found: version,
            });
        }
        let header_len = u64_at(pre, 16);
        let data_offset = u64_at(pre, 24);
        let data_len = u64_at(pre, 32);
        let expected = data_offset
            .checked_add(data_len)
            .filter(|_| data_offset >= PREAMBLE_LEN.saturating_add(header_len))
            .ok_or_else(|| PlanError::Invalid {
                path: path.to_path_buf(),
                reason: "preamble lengths overflow or overlap".into(),
            })?;
        if len < expected {
            return Err(truncated(expected));
        }
        let mut header_bytes = vec![0u8; header_len as usize];
        bytes.read_at(path, PREAMBLE_LEN, &mut header_bytes)?;
        let check = |what, stored, computed| {
            if computed == stored {
                Ok(())
            } else {
                Err(PlanError::Checksum {
                    path: path.to_path_buf(),
                    what,
                    stored,
                    computed,
                })
            }
        };
        check("header", u32_at(pre, 40), crc32(&header_bytes))?;
        check(
            "data",
            u32_at(pre, 44),
            bytes.crc(path, data_offset, data_len)?,
        )?;
        let header: PlanHeader =
            serde_json::from_slice(&header_bytes).map_err(|source| PlanError::Header {
                path: path.to_path_buf(),
                source,
            })?;
        header
            .validate(data_len)
            .map_err(|reason| PlanError::Invalid {
                path: path.to_path_buf(),
                reason,
            })?;
        Ok(PlanFile {
            path: path.to_path_buf(),
            bytes,
            data_offset,
            header,
        })
    }

    /// The bytes of a section (validated to lie inside the data region):
    /// borrowed from a plan in memory, read from a file. For small sections
    /// such as the tokenizer; read weights with [`PlanFile::read_section`].
    pub fn section_bytes(&self, r: SectionRef) -> Result<Cow<'_, [u8]>, PlanError> {
        let start = self.data_offset + r.offset;
        match &self.bytes {
            PlanBytes::Owned(bytes) => Ok(Cow::Borrowed(
                &bytes[start as usize..(start + r.len) as usize],
            )),
            // Read from a file or a source.
            _ => {
                let mut buf = vec![0u8; r.len as usize];
                self.bytes.read_at(&self.path, start, &mut buf)?;
                Ok(Cow::Owned(buf))
            }
        }
    }

    /// Fills `dst` with the bytes of section `r` from byte `offset` of it:
    /// copied from a plan in memory, read from a file or a source (the
    /// caller's buffer, reused from chunk to chunk: the runtime copies it
    /// on into mapped staging memory, which it may only write). A file that
    /// has become shorter since it was opened is [`PlanError::Changed`],
    /// never a fault.
    pub fn read_section(
        &self,
        r: SectionRef,
        offset: u64,
        dst: &mut [u8],
    ) -> Result<(), PlanError> {
        let len = dst.len();
        if offset.checked_add(len as u64).is_none_or(|end| end > r.len) {
            return Err(PlanError::Invalid {
                path: self.path.clone(),
                reason: format!(
                    "bytes {offset}..+{len} asked of a section of {} bytes",
                    r.len
                ),
            });
        }
        self.bytes
            .read_at(&self.path, self.data_offset + r.offset + offset, dst)
    }

    /// Checks that the file still has the length and modification time it
    /// had when opened; call it after reading sections, to catch a plan
    /// rewritten in place while it was read (reads past a shortened end
    /// fail by themselves). Always `Ok` for a plan in memory.
    pub fn check_unchanged(&self) -> Result<(), PlanError> {
        #[cfg(not(target_arch = "wasm32"))]
        if let PlanBytes::File {
            file,
            len,
            modified,
        } = &self.bytes
        {
            let meta = file.metadata().map_err(io_err(&self.path))?;
            let change = if meta.len() != *len {
                format!("now {} bytes, was {len}", meta.len())
            } else if meta.modified().ok() != *modified {
                "modified in place".to_string()
            } else {
                return Ok(());
            };
            return Err(PlanError::Changed {
                path: self.path.clone(),
                change,
            });
        }
        Ok(())
    }

    /// The path the plan was read from (the name given to [`PlanFile::from_bytes`]).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Total size of the file in bytes.
    pub fn file_len(&self) -> u64 {
        self.bytes.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The parallel CRC equals the sequential one, for data of several
    /// slices with a ragged end and for data of one.
    #[test]
    fn parallel_crc_matches_sequential() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let bytes: Vec<u8> = (0..3 * CRC_CHUNK + 12_345)
            .map(|_| {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1);
                (state >> 56) as u8
            })
            .collect();
        assert_eq!(crc32(&bytes), crc32fast::hash(&bytes));
        assert_eq!(crc32(&bytes[..1000]), crc32fast::hash(&bytes[..1000]));
    }
}
