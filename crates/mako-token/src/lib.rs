//! mako-token
