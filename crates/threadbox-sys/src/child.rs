//! The old path of [`crate::process`] and the descriptor helpers of [`crate::fs`], kept so
//! that the agent and core need not change their imports with the move.

pub use crate::fs::{
    fs_type, is_kernel_interface_fs, openat2, take_inherited_fd, DirFd, RESOLVE_NO_MAGICLINKS,
    RESOLVE_NO_SYMLINKS,
};
pub use crate::process::*;
