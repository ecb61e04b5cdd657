//! mako-fs
