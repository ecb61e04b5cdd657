//! mako-format
