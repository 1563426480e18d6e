//! Snapshot files on disk: a guarded read (regular files only, checked as they arrive) and
//! an atomic replace, private by default and never through another user's link, which the
//! exports share.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::analysis::parallel;
use crate::analysis::snapshot::Snapshot;
use crate::error::{Error, Result};

use super::decode::{check_header, walk_sections};
use super::encode::Encoder;
use super::*;

/// Reads and decodes a snapshot file.
pub fn load(path: &Path) -> Result<(Snapshot, Attributes)> {
    load_interruptible(path, &mut || Ok(()))
}

/// [`load`], calling `check` between two chunks of the read (every [`READ_CHUNK`] bytes and
/// after a read interrupted by a signal) and giving up with its error: the pyo3 layer
/// passes a check of pending signals, so that Ctrl-C stops the read of a large file
/// instead of waiting for its end.
pub fn load_interruptible(
    path: &Path,
    check: &mut dyn FnMut() -> Result<()>,
) -> Result<(Snapshot, Attributes)> {
    let format_err = |reason: Reason| reason.at(path);
    let data = read_snapshot_file(path, check)?.map_err(format_err)?;
    decode(&data).map_err(format_err)
}

/// Bytes read per `read()` call: small enough that a structure error shows before much of a
/// large file is read, large enough to cost nothing in system calls.
pub(super) const READ_CHUNK: usize = 8 << 20;
/// Reserved at once for a file up to this size; larger files grow as they are read, so a
/// file that claims to be huge (a sparse file) costs memory only for the bytes actually read
/// before it is refused.
const READ_RESERVE: usize = 64 << 20;

/// Reads a snapshot file whole, checking it as it comes: `Ok(Err(reason))` for a file that is
/// not a snapshot.
///
/// Only a regular file is read: a FIFO, a device or a socket is refused before any read, and
/// opened without blocking, since reading `/dev/zero` or a FIFO without a writer would never
/// end. The header is checked from the first 12 bytes and the section structure as each
/// chunk arrives, so a file that is not a snapshot costs one small read however large it
/// says it is; nothing past the size the file had when opened is read.
fn read_snapshot_file(
    path: &Path,
    check: &mut dyn FnMut() -> Result<()>,
) -> Result<std::result::Result<Vec<u8>, Reason>> {
    use std::io::Read;
    use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
    let io_err = |action: &'static str| {
        move |source| Error::Io {
            path: path.to_path_buf(),
            action,
            source,
        }
    };
    let mut file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(io_err("read"))?;
    let meta = file.metadata().map_err(io_err("read"))?;
    let kind = meta.file_type();
    if kind.is_dir() {
        return Err(io_err("read")(std::io::Error::from_raw_os_error(
            libc::EISDIR,
        )));
    }
    if !kind.is_file() {
        let what = if kind.is_fifo() {
            "a FIFO"
        } else if kind.is_char_device() {
            "a character device"
        } else if kind.is_block_device() {
            "a block device"
        } else if kind.is_socket() {
            "a socket"
        } else {
            "a special file"
        };
        return Ok(Err(Reason::from(format!(
            "it is {what}, not a regular file (snapshots are read from regular files only)"
        ))));
    }
    let total = usize::try_from(meta.len()).unwrap_or(usize::MAX);
    let mut data: Vec<u8> = Vec::new();
    // MemoryError, as for every other result too large to hold, not an OSError: the read
    // went fine, the file is simply larger than the memory left.
    let out_of_memory = || Error::OutOfMemory;
    data.try_reserve_exact(total.min(READ_RESERVE))
        .map_err(|_| out_of_memory())?;
    let mut pos = HEADER_LEN;
    let mut header_checked = false;
    while data.len() < total {
        check()?;
        // The header alone first, then chunks.
        let want = match header_checked {
            false => HEADER_LEN,
            true => READ_CHUNK,
        }
        .min(total - data.len());
        if data.capacity() - data.len() < want {
            let grow = want.max(data.len().min(total - data.len()));
            data.try_reserve_exact(grow).map_err(|_| out_of_memory())?;
        }
        let start = data.len();
        data.resize(start + want, 0);
        let mut got = 0;
        while got < want {
            match file.read(&mut data[start + got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => check()?,
                Err(e) => return Err(io_err("read")(e)),
            }
        }
        data.truncate(start + got);
        if got < want {
            // The file shrank while being read: decode reports it truncated.
            break;
        }
        if !header_checked {
            if let Err(reason) = check_header(&data) {
                return Ok(Err(reason));
            }
            header_checked = true;
        }
        if let Err(reason) = walk_sections(&data, total, &mut pos) {
            return Ok(Err(reason));
        }
    }
    Ok(Ok(data))
}

/// Writes a snapshot file atomically and durably (see [`write_atomic`]).
pub fn dump(path: &Path, snapshot: &Snapshot, attrs: &Attributes) -> Result<()> {
    let encoder = Encoder::new(snapshot, attrs, parallel::parts_for)?;
    replace_file(path, &encoder.pieces())
}

/// Writes a file atomically: the bytes go to a temporary file in the same directory, synced
/// to disk, then renamed over `path`, and the directory is synced, so neither a failed or
/// interrupted write nor a crash soon after leaves a partial or empty file at `path`. On any
/// error before the rename the temporary file is removed and an existing file at `path` is
/// left untouched. The new file has mode [`file_mode`] (0600 by default), and a symbolic link
/// at `path` is followed only if it is the writer's own or root's. Snapshot dumps and exports
/// share it.
pub fn write_atomic(path: &Path, data: &[u8]) -> Result<()> {
    replace_file(path, &[data])
}

/// [`write_atomic`] of the concatenation of `pieces`, which are written one after the
/// other, never copied into one buffer.
fn replace_file(path: &Path, pieces: &[&[u8]]) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let write = |mut f: &fs::File| pieces.iter().try_for_each(|p| f.write_all(p));
    let io_err = |action: &'static str, p: &Path| {
        let p = p.to_path_buf();
        move |source| Error::Io {
            path: p,
            action,
            source,
        }
    };
    let mode = file_mode()?;
    // Replacing by rename is only right for a regular file (or no file yet). A device or a
    // FIFO is written to, as `open()` would, instead of being replaced by a regular file; a
    // symbolic link of the writer's (or root's) keeps pointing where it did, at the file that
    // gets replaced. A link owned by anyone else is never followed: in a shared sticky
    // directory it may have been planted at the next dump name to make this write replace
    // (or write into) a file of the link owner's choosing, so the link itself is replaced.
    let planted = fs::symlink_metadata(path)
        .map(|meta| meta.file_type().is_symlink() && !trusted_link(&meta))
        .unwrap_or(false);
    let path = match fs::metadata(path) {
        _ if planted => path.to_path_buf(),
        Ok(meta) if !meta.is_file() => {
            let f = fs::OpenOptions::new()
                .write(true)
                .open(path)
                .map_err(io_err("open", path))?;
            return write(&f).map_err(io_err("write", path));
        }
        Ok(_) => fs::canonicalize(path).map_err(io_err("resolve", path))?,
        Err(_) => path.to_path_buf(),
    };
    let path = path.as_path();
    // The file being replaced, held open across the rename so that the rename only unlinks
    // it: freeing its blocks happens at the last close instead, which `close_in_background`
    // does off the caller's thread (measured: 2-8 ms inside `rename` for a 3 MB file on
    // ext4). Not readable, or not there: nothing to hold. Nor a planted link: opening it
    // would open what it leads to (a FIFO would block).
    let replaced = match planted {
        true => None,
        false => fs::File::open(path).ok(),
    };
    let tmp = temp_path(path);
    let result = (|| {
        let f = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)
            .map_err(io_err("create", &tmp))?;
        write(&f).map_err(io_err("write", &tmp))?;
        // On disk before it gets the good name: after a crash the name holds either the old
        // file or the complete new one, never an empty or partial file.
        f.sync_data().map_err(io_err("sync", &tmp))?;
        drop(f);
        fs::rename(&tmp, path).map_err(io_err("replace", path))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
        return result;
    }
    let synced = sync_parent(path);
    if let Some(file) = replaced {
        close_in_background(file);
    }
    synced
}

/// The variable that asks for other permissions than [`DEFAULT_MODE`] on written files.
pub const MODE_VARIABLE: &str = "ALLOCTRACE_FILE_MODE";
/// Snapshots and exports may hold secrets (file paths, dict keys in retention paths): like
/// core dumps, they are readable by their owner only unless `ALLOCTRACE_FILE_MODE` says
/// otherwise. The umask still applies.
pub const DEFAULT_MODE: u32 = 0o600;

/// The permissions new files are created with: `ALLOCTRACE_FILE_MODE` (octal, such as
/// `0644` or `640`) or [`DEFAULT_MODE`].
pub fn file_mode() -> Result<u32> {
    let Some(value) = std::env::var_os(MODE_VARIABLE) else {
        return Ok(DEFAULT_MODE);
    };
    let text = value.to_string_lossy();
    let digits = text.trim();
    let digits = digits.strip_prefix("0o").unwrap_or(digits);
    match u32::from_str_radix(digits, 8) {
        Ok(mode) if !digits.is_empty() && mode <= 0o777 => Ok(mode),
        _ => Err(Error::InvalidArgument(format!(
            "{MODE_VARIABLE}={text:?}: expected permission bits in octal, like 0600 or 0644"
        ))),
    }
}

/// Whether a symbolic link may be followed by this process's writes: it is the writer's own
/// or root's (`/dev/stdout`), so no other user chose where it leads.
fn trusted_link(meta: &fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid cannot fail and touches no memory.
    let euid = unsafe { libc::geteuid() };
    meta.uid() == euid || meta.uid() == 0
}

/// Closes a file on a short-lived thread of its own, or here if no thread can be started.
/// For a file already unlinked, the close is what frees its blocks.
///
/// A process that forks before the thread has closed it leaves the child a descriptor of
/// the old file, which keeps its blocks until the child closes it or exits: the price of not
/// making every `dump()` wait for them.
fn close_in_background(file: fs::File) {
    // A thread that cannot be started drops its closure, and the file with it, right here.
    let _ = std::thread::Builder::new()
        .name("alloctrace-close".into())
        .spawn(move || drop(file));
}

/// Makes a rename in `path`'s directory durable. Filesystems that cannot sync a directory
/// (they answer EINVAL) are let be: there is nothing more to do on them.
fn sync_parent(path: &Path) -> Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let synced = fs::File::open(dir).and_then(|d| d.sync_all());
    match synced {
        Err(e) if e.raw_os_error() != Some(libc::EINVAL) => Err(Error::Io {
            path: dir.to_path_buf(),
            action: "sync",
            source: e,
        }),
        _ => Ok(()),
    }
}

/// `.NAME.PID.N.tmp` next to `path`, with NAME cut short where needed so that the whole
/// name fits in the 255 bytes a file name may have: any name that fits there can be
/// dumped to.
pub(super) fn temp_path(path: &Path) -> PathBuf {
    use std::ffi::OsStr;
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    const NAME_MAX: usize = 255;
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let suffix = format!(".{}.{n}.tmp", std::process::id());
    let name = path.file_name().map(OsStr::as_bytes).unwrap_or_default();
    let keep = name.len().min(NAME_MAX - 1 - suffix.len());
    let mut tmp = Vec::with_capacity(NAME_MAX);
    tmp.push(b'.');
    tmp.extend_from_slice(&name[..keep]);
    tmp.extend_from_slice(suffix.as_bytes());
    path.with_file_name(std::ffi::OsString::from_vec(tmp))
}
