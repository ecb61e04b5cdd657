//! mako-control
