//! Copying sparse files without filling their holes: a 10 GiB disk image whose file
//! system takes 4 MiB stays 4 MiB on the host.

use crate::{Result, SysError};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsFd;
use std::path::Path;

/// `lseek(fd, offset, whence)`, `None` at ENXIO (no data or hole at or after `offset`).
fn seek(f: &File, offset: u64, whence: libc::c_int) -> Result<Option<u64>> {
    match crate::raw::fd::lseek(f.as_fd(), offset as i64, whence) {
        Ok(r) => Ok(Some(r)),
        Err(e) if e.raw_os_error() == Some(libc::ENXIO) => Ok(None),
        Err(e) => Err(SysError::os("seek data/hole", e)),
    }
}

/// Copies `src` to a new file `dst` (which must not exist), keeping holes as holes.
pub fn copy_sparse(src: &Path, dst: &Path) -> Result<()> {
    let mut from =
        File::open(src).map_err(|e| SysError::os(format!("open {}", src.display()), e))?;
    let len = from
        .metadata()
        .map_err(|e| SysError::os(format!("stat {}", src.display()), e))?
        .len();
    let mut to = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(dst)
        .map_err(|e| SysError::os(format!("create {}", dst.display()), e))?;
    to.set_len(len)
        .map_err(|e| SysError::os(format!("size {}", dst.display()), e))?;
    let mut buf = vec![0u8; 1 << 20];
    let mut pos = 0u64;
    while pos < len {
        let Some(data) = seek(&from, pos, libc::SEEK_DATA)? else {
            break;
        };
        let end = seek(&from, data, libc::SEEK_HOLE)?.unwrap_or(len).min(len);
        from.seek(SeekFrom::Start(data))
            .map_err(|e| SysError::os("seek source", e))?;
        to.seek(SeekFrom::Start(data))
            .map_err(|e| SysError::os("seek target", e))?;
        let mut left = end - data;
        while left > 0 {
            let n = (left as usize).min(buf.len());
            from.read_exact(&mut buf[..n])
                .map_err(|e| SysError::os("read source", e))?;
            to.write_all(&buf[..n])
                .map_err(|e| SysError::os("write target", e))?;
            left -= n as u64;
        }
        pos = end;
    }
    to.sync_all()
        .map_err(|e| SysError::os(format!("sync {}", dst.display()), e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn keeps_content_and_holes() {
        let dir = std::env::temp_dir().join(format!("tb-sparse-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("src");
        let dst = dir.join("dst");
        let mut f = File::create(&src).unwrap();
        f.set_len(256 << 20).unwrap();
        for (off, byte) in [(0u64, 1u8), (100 << 20, 2), ((256 << 20) - 3, 3)] {
            f.seek(SeekFrom::Start(off)).unwrap();
            f.write_all(&[byte; 3]).unwrap();
        }
        drop(f);
        copy_sparse(&src, &dst).unwrap();
        assert_eq!(std::fs::read(&src).unwrap(), std::fs::read(&dst).unwrap());
        let blocks = std::fs::metadata(&dst).unwrap().blocks() * 512;
        assert!(
            blocks < 4 << 20,
            "the copy filled its holes: {blocks} bytes allocated"
        );
        assert!(
            copy_sparse(&src, &dst).is_err(),
            "an existing target must not be overwritten"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
