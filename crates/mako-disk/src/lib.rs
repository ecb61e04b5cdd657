//! mako-disk
