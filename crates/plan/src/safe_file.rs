//! Files written so they are never half-written or clobbered, and inputs
//! that are regular files or a clear error.
//!
//! [`write_file_with`] (and [`write_file`], and [`write_file_seekable`] for a
//! writer that fills in a field at the start last) is how every file gerbil writes
//! reaches its target (plans, tuning JSON, SVGs, WGSL and Graphviz dumps): the
//! bytes go to a new temporary file in the target's directory, created
//! exclusively under the name `.{target}.gerbil-tmp-XXXXXX`, are synced to
//! disk, and the temporary file is renamed over the target only when all of
//! it was written. On an error (or a panic) the temporary file is removed and
//! the old target, if any, is left as it was. The temporary files of writes
//! in progress are listed process-wide so that a Ctrl-C handler can delete
//! them before the process exits ([`remove_unfinished`]; `gerbilc` installs
//! one). A process killed otherwise (SIGKILL, power loss) leaves at most one
//! such hidden file, which is safe to delete; it is not cleaned
//! automatically because a concurrent writer may still own it.
//!
//! Two writers of the same target each write their own temporary file, so
//! the target is always one complete file of one of them: the last rename
//! wins, and the other writer's file is replaced (its own report of success
//! was true when it renamed, but the file now holds the other's bytes).
//!
//! [`check_output`] refuses a target that exists and is not a regular file
//! (a directory, a device such as `/dev/null`, a FIFO) or that is the same
//! file as one of the inputs; call it before long work so the error comes
//! first. [`check_input`] refuses an input that is not a regular file
//! *before* opening it: opening a FIFO for reading would block until a
//! writer appears, and a directory or a device cannot be read as a file.

use std::fs::{File, Metadata};
use std::io::{BufWriter, Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The temporary files of the writes in progress in this process.
static UNFINISHED: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Lists a temporary file in [`UNFINISHED`] while it lives.
struct Unfinished(PathBuf);

impl Unfinished {
    fn new(path: &Path) -> Unfinished {
        lock_unfinished().push(path.to_path_buf());
        Unfinished(path.to_path_buf())
    }
}

impl Drop for Unfinished {
    fn drop(&mut self) {
        lock_unfinished().retain(|p| *p != self.0);
    }
}

/// A new file at `path`, readable and writable, failing if one exists;
/// on Unix with what `File::create` gives (0666 less the umask), not a
/// temporary file's usual 0600.
fn create_new(path: &Path) -> std::io::Result<File> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true).write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o666);
    }
    options.open(path)
}

fn lock_unfinished() -> std::sync::MutexGuard<'static, Vec<PathBuf>> {
    // A panic while the list was held leaves it intact: keep using it.
    UNFINISHED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Deletes the temporary files of the writes in progress (none of their
/// targets has been touched yet) and returns their paths.
/// For an interrupt handler, which then ends the process: a write that goes
/// on afterwards fails, since its file is gone.
pub fn remove_unfinished() -> Vec<PathBuf> {
    let mut list = lock_unfinished();
    for p in list.iter() {
        let _ = std::fs::remove_file(p);
    }
    std::mem::take(&mut *list)
}

/// Why a file could not be checked or written.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The file system refused an operation.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The output exists and is a directory.
    #[error("`{}` is a directory; give a file name (for example `{}`)", .0.display(), .0.join("model.plan").display())]
    OutputIsDirectory(PathBuf),
    /// The output exists and is not a regular file (a device, a FIFO, a socket).
    #[error("`{}` is {kind}, not a regular file; gerbil writes only regular files: give a file name", path.display())]
    OutputNotRegular {
        /// The output.
        path: PathBuf,
        /// What it is, with an article ("a character device").
        kind: &'static str,
    },
    /// The directory a new output would go in is missing or not a directory.
    #[error("cannot write `{}`: its directory `{}` {reason}; create it first or give another path", output.display(), output.parent().unwrap_or(Path::new(".")).display())]
    NoDirectory {
        /// The output.
        output: PathBuf,
        /// "does not exist" or "is not a directory".
        reason: &'static str,
    },
    /// The output is the same file as one of the inputs.
    #[error("`{}` is the same file as the input `{}`; writing it would destroy the input: give another output name", output.display(), input.display())]
    OutputIsInput {
        /// The output.
        output: PathBuf,
        /// The input it names.
        input: PathBuf,
    },
    /// An input is not a regular file.
    #[error("`{}` is {kind}, not a regular file; give the path of a file", path.display())]
    InputNotRegular {
        /// The input.
        path: PathBuf,
        /// What it is, with an article ("a directory", "a FIFO (named pipe)").
        kind: &'static str,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> FileError + '_ {
    move |source| FileError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// What a non-regular file is, with an article, for messages.
fn kind_of(meta: &Metadata) -> &'static str {
    let t = meta.file_type();
    if t.is_dir() {
        return "a directory";
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return "a FIFO (named pipe)";
        }
        if t.is_char_device() {
            return "a character device";
        }
        if t.is_block_device() {
            return "a block device";
        }
        if t.is_socket() {
            return "a socket";
        }
    }
    "a special file"
}

/// Whether two metadata describe the same file (device and inode on Unix).
fn same_file(a: &Metadata, b: &Metadata) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        a.dev() == b.dev() && a.ino() == b.ino()
    }
    #[cfg(not(unix))]
    {
        let _ = (a, b);
        false
    }
}

/// Checks that `path` names a regular file (following symlinks) without
/// opening it, and returns its metadata.
pub fn check_input(path: &Path) -> Result<Metadata, FileError> {
    let meta = std::fs::metadata(path).map_err(io_err(path))?;
    if meta.is_file() {
        Ok(meta)
    } else {
        Err(FileError::InputNotRegular {
            path: path.to_path_buf(),
            kind: kind_of(&meta),
        })
    }
}

/// Opens an input for reading after [`check_input`], and checks again on
/// the open file (the path could have been replaced in between).
pub fn open_input(path: &Path) -> Result<File, FileError> {
    check_input(path)?;
    let file = File::open(path).map_err(io_err(path))?;
    let meta = file.metadata().map_err(io_err(path))?;
    if !meta.is_file() {
        return Err(FileError::InputNotRegular {
            path: path.to_path_buf(),
            kind: kind_of(&meta),
        });
    }
    Ok(file)
}

/// Checks that a new file `output` has a directory to go in.
fn check_parent(output: &Path) -> Result<(), FileError> {
    let parent = match output.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => return Ok(()),
    };
    match std::fs::metadata(parent) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(FileError::NoDirectory {
            output: output.to_path_buf(),
            reason: "is not a directory",
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(FileError::NoDirectory {
            output: output.to_path_buf(),
            reason: "does not exist",
        }),
        Err(e) => Err(io_err(parent)(e)),
    }
}

/// Checks that `output` can be written without harm: it does not exist, or
/// it is a regular file that is none of `inputs` (compared as files, so
/// other spellings, hard links and symlinks of an input are caught).
/// Inputs that do not exist are skipped.
pub fn check_output(output: &Path, inputs: &[PathBuf]) -> Result<(), FileError> {
    let meta = match std::fs::metadata(output) {
        Ok(meta) => meta,
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory
            ) =>
        {
            return check_parent(output)
        }
        Err(e) => return Err(io_err(output)(e)),
    };
    if meta.is_dir() {
        return Err(FileError::OutputIsDirectory(output.to_path_buf()));
    }
    if !meta.is_file() {
        return Err(FileError::OutputNotRegular {
            path: output.to_path_buf(),
            kind: kind_of(&meta),
        });
    }
    for input in inputs {
        if let Ok(im) = std::fs::metadata(input) {
            if same_file(&meta, &im) {
                return Err(FileError::OutputIsInput {
                    output: output.to_path_buf(),
                    input: input.clone(),
                });
            }
        }
    }
    Ok(())
}

/// A writer that can also seek: what [`write_file_seekable`] hands its
/// callback, so that a field written first can be filled in last (the
/// plan's data checksum).
pub trait WriteSeek: Write + Seek {}

impl<T: Write + Seek> WriteSeek for T {}

/// Writes `bytes` to `path` as [`write_file_with`] does.
pub fn write_file(path: &Path, bytes: &[u8]) -> Result<(), FileError> {
    write_file_with(path, |w| w.write_all(bytes))
}

/// Writes `path` through `write`: into a new temporary file next to it,
/// synced, then renamed over `path` (see the module doc). `write` gets a
/// buffered writer. A symlink at
/// `path` is followed, so the file it points to is replaced. `path` is
/// checked with [`check_output`] (no inputs) first.
pub fn write_file_with(
    path: &Path,
    write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> Result<(), FileError> {
    write_file_seekable(path, |w| write(w))
}

/// [`write_file_with`] whose `write` may also seek in the temporary file,
/// to go back and fill in something it knows only at the end; whatever it
/// leaves behind it (the file's end is where it wrote furthest) is the file.
pub fn write_file_seekable(
    path: &Path,
    write: impl FnOnce(&mut dyn WriteSeek) -> std::io::Result<()>,
) -> Result<(), FileError> {
    check_output(path, &[])?;
    let target = match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => std::fs::canonicalize(path).map_err(io_err(path))?,
        _ => path.to_path_buf(),
    };
    let dir = match target.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let prefix = format!(".{name}.gerbil-tmp-");
    // Listed before the file exists: an interrupt from the moment it
    // appears finds it (listed after, a Ctrl-C between the two left it).
    let mut listed = None;
    let tmp = tempfile::Builder::new()
        .prefix(&prefix)
        .rand_bytes(6)
        .make_in(&dir, |path| {
            let entry = Unfinished::new(path);
            let file = create_new(path)?;
            listed = Some(entry);
            Ok(file)
        })
        .map_err(io_err(&dir))?;
    let _listed = listed;
    let tmp_path = tmp.path().to_path_buf();
    let mut w = BufWriter::with_capacity(1 << 20, tmp);
    write(&mut w).map_err(io_err(&tmp_path))?;
    let tmp = w
        .into_inner()
        .map_err(|e| io_err(&tmp_path)(e.into_error()))?;
    tmp.as_file().sync_all().map_err(io_err(&tmp_path))?;
    tmp.persist(&target).map_err(|e| io_err(&target)(e.error))?;
    // The rename is durable once the directory is synced (best effort:
    // some file systems cannot open a directory for syncing).
    #[cfg(unix)]
    if let Ok(d) = File::open(&dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leftovers(dir: &Path) -> Vec<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains("gerbil-tmp"))
            .collect()
    }

    #[test]
    fn success_replaces_the_target() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.plan");
        std::fs::write(&path, b"old").unwrap();
        write_file(&path, b"new bytes").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new bytes");
        assert!(leftovers(dir.path()).is_empty());
    }

    #[test]
    fn the_temporary_file_is_hidden_next_to_the_target_while_writing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.plan");
        write_file_with(&path, |w| {
            w.write_all(b"x")?;
            let names = leftovers(dir.path());
            assert_eq!(names.len(), 1, "{names:?}");
            assert!(names[0].starts_with(".a.plan.gerbil-tmp-"), "{names:?}");
            Ok(())
        })
        .unwrap();
        assert!(leftovers(dir.path()).is_empty());
    }

    #[test]
    fn an_error_keeps_the_old_file_and_removes_the_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.plan");
        std::fs::write(&path, b"old").unwrap();
        let err = write_file_with(&path, |w| {
            w.write_all(&[7u8; 3 << 20])?;
            Err(std::io::Error::other("disk on fire"))
        })
        .unwrap_err();
        assert!(err.to_string().contains("disk on fire"), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), b"old");
        assert!(leftovers(dir.path()).is_empty());
    }

    #[test]
    fn a_seekable_write_fills_in_its_start_last() {
        use std::io::SeekFrom;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.plan");
        write_file_seekable(&path, |w| {
            w.write_all(b"....")?;
            w.write_all(&[9u8; 3 << 20])?;
            w.seek(SeekFrom::Start(0))?;
            w.write_all(b"head")
        })
        .unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes.len(), 4 + (3 << 20));
        assert_eq!(&bytes[..4], b"head");
        assert!(bytes[4..].iter().all(|&b| b == 9));
        assert!(leftovers(dir.path()).is_empty());
    }

    #[test]
    fn a_panic_while_writing_removes_the_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.plan");
        let result = std::panic::catch_unwind(|| {
            let _ = write_file_with(&path, |_| panic!("boom"));
        });
        assert!(result.is_err());
        assert!(!path.exists());
        assert!(leftovers(dir.path()).is_empty());
    }

    #[test]
    fn a_directory_target_is_refused_and_left_empty() {
        let dir = tempfile::tempdir().unwrap();
        let err = write_file(dir.path(), b"x").unwrap_err();
        assert!(
            err.to_string().contains("is a directory; give a file name"),
            "{err}"
        );
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[cfg(unix)]
    #[test]
    fn a_device_target_is_refused_before_anything_is_written() {
        let err = check_output(Path::new("/dev/null"), &[]).unwrap_err();
        assert!(
            err.to_string()
                .contains("is a character device, not a regular file"),
            "{err}"
        );
    }

    #[test]
    fn an_output_that_is_an_input_is_refused_under_any_spelling() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("config.json");
        std::fs::write(&input, b"{}").unwrap();
        let other_spelling = dir.path().join(".").join("config.json");
        let err = check_output(&other_spelling, std::slice::from_ref(&input)).unwrap_err();
        assert!(err.to_string().contains("same file as the input"), "{err}");
        check_output(&dir.path().join("out.plan"), std::slice::from_ref(&input)).unwrap();
    }

    #[test]
    fn a_symlinked_target_replaces_the_file_it_points_to() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real.plan");
        let link = dir.path().join("link.plan");
        std::fs::write(&real, b"old").unwrap();
        #[cfg(unix)]
        {
            std::os::unix::fs::symlink(&real, &link).unwrap();
            write_file(&link, b"new").unwrap();
            assert!(std::fs::symlink_metadata(&link)
                .unwrap()
                .file_type()
                .is_symlink());
            assert_eq!(std::fs::read(&real).unwrap(), b"new");
        }
    }

    #[test]
    fn an_output_without_its_directory_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("no/such/model.plan");
        let err = write_file(&missing, b"x").unwrap_err().to_string();
        assert!(
            err.contains("its directory") && err.contains("does not exist"),
            "{err}"
        );
        let file = dir.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        let err = write_file(&file.join("model.plan"), b"x")
            .unwrap_err()
            .to_string();
        assert!(err.contains("is not a directory"), "{err}");
        assert_eq!(leftovers(dir.path()), Vec::<String>::new());
    }

    #[test]
    fn a_directory_input_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let err = open_input(dir.path()).unwrap_err();
        assert!(
            err.to_string()
                .contains("is a directory, not a regular file"),
            "{err}"
        );
    }
}
