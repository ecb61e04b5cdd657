//! mako-fuse
