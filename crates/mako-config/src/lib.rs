//! mako-config
