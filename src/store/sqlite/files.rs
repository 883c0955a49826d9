//! The database's files on disk: readable by their owner alone, since they hold every answer and tool
//! argument, and never reached through a symbolic link, which would put them wherever the link points.

use std::fs::{File, Permissions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::fcntl::OFlag;

/// The mode of a file the store creates: read and written by its owner alone, whatever the umask.
const PRIVATE: u32 = 0o600;
/// The mode of a directory the store creates, so that nobody else can replace the files in it.
const PRIVATE_DIRECTORY: u32 = 0o700;
/// The files SQLite keeps beside a database (`PATH-wal` …); it creates them with the database file's mode.
const COMPANIONS: [&str; 3] = ["-wal", "-shm", "-journal"];

/// Creates `directory` and its missing parents, owner-only; a directory already there is left as it is.
pub(super) fn create_directory(directory: &Path) -> Result<(), String> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(PRIVATE_DIRECTORY)
        .create(directory)
        .map_err(|error| format!("cannot create its directory {}: {error}", directory.display()))
}

/// Makes the database at `path` ready for SQLite: the file is created owner-only when it is not there, a
/// symbolic link at it or at a file SQLite keeps beside it is refused, and any of them that others may read or
/// write is made owner-only, with a warning.
pub(super) fn prepare(path: &Path) -> Result<(), String> {
    open_private(path, true)?;
    for suffix in COMPANIONS {
        open_private(&beside(path, suffix), false)?;
    }
    Ok(())
}

/// Opens (creating it owner-only) the lock file `PATH.lock`, never through a symbolic link.
pub(super) fn open_lock(path: &Path) -> Result<File, String> {
    let lock = beside(path, ".lock");
    open_private(&lock, true).map(|file| file.expect("a file opened with create is there"))
}

/// Why nothing can be created at `to`, when something is there: a file, or a symbolic link (dangling or not).
pub(super) fn occupied(to: &Path) -> Option<&'static str> {
    let metadata = std::fs::symlink_metadata(to).ok()?;
    Some(if metadata.file_type().is_symlink() {
        "it is a symbolic link, which is never followed"
    } else {
        "that file exists"
    })
}

/// Creates `to` for a copy of the database: a new file, owner-only, never through a symbolic link.
pub(super) fn create_new(to: &Path) -> Result<(), String> {
    let created = File::options()
        .write(true)
        .create_new(true)
        .mode(PRIVATE)
        .custom_flags(OFlag::O_NOFOLLOW.bits())
        .open(to);
    match created {
        Ok(_) => Ok(()),
        Err(error) => Err(match occupied(to) {
            Some(why) => format!("{why}; name a new file"),
            None => format!("cannot create it: {error}"),
        }),
    }
}

/// The file named `path` with `suffix` appended (`gateway.sqlite3-wal`).
fn beside(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// Opens the file at `path`, never through a symbolic link, and takes away what others may do with it; when
/// `create`, a file not there is created owner-only, else it is `None`.
fn open_private(path: &Path, create: bool) -> Result<Option<File>, String> {
    let opened = File::options()
        .read(true)
        .write(create)
        .create(create)
        .mode(PRIVATE)
        .custom_flags(OFlag::O_NOFOLLOW.bits())
        .open(path);
    let file = match opened {
        Ok(file) => file,
        Err(_) if is_symlink(path) => {
            return Err(format!(
                "{} is a symbolic link, which the store never follows (it would put every answer wherever the link \
                 points): give the path of the file itself, or remove the link",
                path.display()
            ));
        }
        Err(error) if error.kind() == io::ErrorKind::NotFound && !create => return Ok(None),
        Err(error) => return Err(format!("cannot open {}: {error}", path.display())),
    };
    let metadata = file
        .metadata()
        .map_err(|error| format!("cannot read the permissions of {}: {error}", path.display()))?;
    if !metadata.is_file() {
        return Err(format!("{} is not a regular file", path.display()));
    }
    let mode = metadata.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        let owner_only = mode & 0o700;
        file.set_permissions(Permissions::from_mode(owner_only)).map_err(|error| {
            format!(
                "{} may be read or written by others (mode {mode:o}) and cannot be made its owner's alone: {error}; \
                 run the gateway as the file's owner, or chmod 600 it",
                path.display()
            )
        })?;
        tracing::warn!(
            file = %path.display(),
            was = %format!("{mode:o}"),
            now = %format!("{owner_only:o}"),
            "a store file was open to others; it is now its owner's alone"
        );
    }
    Ok(Some(file))
}

fn is_symlink(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|metadata| metadata.file_type().is_symlink())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn a_file_open_to_others_keeps_only_its_owners_bits() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gateway.sqlite3");
        for (before, after) in [
            (0o644, 0o600),
            (0o660, 0o600),
            (0o444, 0o400),
            (0o600, 0o600),
            (0o400, 0o400),
        ] {
            std::fs::write(&path, b"").unwrap();
            std::fs::set_permissions(&path, Permissions::from_mode(before)).unwrap();
            open_private(&path, false).unwrap();
            assert_eq!(mode(&path), after, "{before:o}");
        }
    }

    #[test]
    fn a_symbolic_link_is_refused_and_its_target_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("elsewhere");
        let link = dir.path().join("gateway.sqlite3");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        for create in [true, false] {
            let error = open_private(&link, create).unwrap_err();
            assert!(
                error.contains("symbolic link") && error.contains(&link.display().to_string()),
                "{error}"
            );
            assert!(!target.exists(), "a dangling link is never followed");
        }
        std::fs::write(&target, b"kept").unwrap();
        std::fs::set_permissions(&target, Permissions::from_mode(0o644)).unwrap();
        assert!(open_private(&link, true).is_err());
        assert!(create_new(&link).unwrap_err().contains("symbolic link"));
        assert_eq!(occupied(&link), Some("it is a symbolic link, which is never followed"));
        assert_eq!(
            (std::fs::read(&target).unwrap(), mode(&target)),
            (b"kept".to_vec(), 0o644)
        );
    }

    #[test]
    fn a_companion_not_there_is_not_created() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gateway.sqlite3");
        prepare(&path).unwrap();
        assert_eq!(mode(&path), PRIVATE);
        for suffix in COMPANIONS {
            assert!(!beside(&path, suffix).exists(), "{suffix}");
        }
    }
}
