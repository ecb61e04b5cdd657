//! Token modes and the one compatibility table that decides which modes may coexist.
//!
//! Every decision about whether two nodes may hold tokens at the same time is made by
//! [`compatible`]; every decision about whether a node already holds enough is made by
//! [`covers`]. Nothing else in the crate compares modes directly, so changing the
//! table here changes the whole protocol.

use std::fmt;

use serde::{Deserialize, Serialize};

/// What a token lets its holder do with the object it covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum TokenMode {
    /// Shared read: the holder may cache the object and trust the cache, because no
    /// other node can change it while the token is held.
    Ro,
    /// Shared write: many nodes may write at once; sizes and modification times are
    /// merged by the metanode, so no holder may trust cached attributes written by others.
    Rw,
    /// Exclusive write: the holder is the only node with any token on the range.
    Xw,
}

impl TokenMode {
    /// All modes, for exhaustive tests and diagnostics.
    pub const ALL: [TokenMode; 3] = [TokenMode::Ro, TokenMode::Rw, TokenMode::Xw];

    /// The short name the administrator sees in `mako diag tokens`.
    pub fn as_str(self) -> &'static str {
        match self {
            TokenMode::Ro => "ro",
            TokenMode::Rw => "rw",
            TokenMode::Xw => "xw",
        }
    }
}

impl fmt::Display for TokenMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The compatibility table: may one node hold `a` while a *different* node holds `b`
/// on overlapping ranges of the same resource?
///
/// |      | ro  | rw  | xw  |
/// |------|-----|-----|-----|
/// | ro   | yes | no  | no  |
/// | rw   | no  | yes | no  |
/// | xw   | no  | no  | no  |
///
/// Why `ro` × `rw` is refused: a reader caches attributes and data and trusts them for
/// as long as it holds `ro`. Shared writers change size and mtime through the metanode
/// without telling readers, so a reader next to a writer would serve a stale size.
/// `rw` × `rw` is allowed because every shared writer knows that others write too and
/// sends its size and time updates to the metanode instead of trusting its own copy.
/// A node never conflicts with itself; the manager does not consult this table for
/// two tokens of the same node.
pub fn compatible(a: TokenMode, b: TokenMode) -> bool {
    matches!(
        (a, b),
        (TokenMode::Ro, TokenMode::Ro) | (TokenMode::Rw, TokenMode::Rw)
    )
}

/// Does holding `held` already give the holder everything `wanted` would?
///
/// Decision: `xw` covers everything, and each mode covers itself; `rw` does **not**
/// cover `ro`. The promise of `ro` is "no other node writes this while I hold it",
/// and `rw` does not make that promise (other `rw` holders may write). Formally, a
/// mode covers another only if it excludes at least as many foreign modes:
/// `covers(h, w)` implies that every mode compatible with `h` is compatible with `w`
/// (checked exhaustively in the tests). So the capability order is the lattice
/// `ro < xw`, `rw < xw`, with `ro` and `rw` incomparable.
pub fn covers(held: TokenMode, wanted: TokenMode) -> bool {
    held == wanted || held == TokenMode::Xw
}

/// The weakest mode that covers both `a` and `b` (the lattice join). A node that holds
/// `ro` and asks for `rw` on the same range ends up with `xw` there, because it asked
/// for the promises of both.
pub fn join(a: TokenMode, b: TokenMode) -> TokenMode {
    if covers(a, b) {
        a
    } else if covers(b, a) {
        b
    } else {
        TokenMode::Xw
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use TokenMode::*;

    #[test]
    fn table_matches_design() {
        let expected = [
            (Ro, Ro, true),
            (Ro, Rw, false),
            (Ro, Xw, false),
            (Rw, Ro, false),
            (Rw, Rw, true),
            (Rw, Xw, false),
            (Xw, Ro, false),
            (Xw, Rw, false),
            (Xw, Xw, false),
        ];
        for (a, b, want) in expected {
            assert_eq!(compatible(a, b), want, "compatible({a}, {b})");
        }
    }

    #[test]
    fn table_is_symmetric() {
        for a in TokenMode::ALL {
            for b in TokenMode::ALL {
                assert_eq!(compatible(a, b), compatible(b, a), "{a} vs {b}");
            }
        }
    }

    #[test]
    fn covers_is_lattice_order() {
        for m in TokenMode::ALL {
            assert!(covers(m, m), "{m} covers itself");
            assert!(covers(Xw, m), "xw covers {m}");
        }
        assert!(!covers(Rw, Ro), "rw must not cover ro");
        assert!(!covers(Ro, Rw));
        assert!(!covers(Ro, Xw));
        assert!(!covers(Rw, Xw));
    }

    /// A covering mode must exclude at least what the covered mode excludes, or a node
    /// answering "already covered" would break the promise of the wanted mode.
    #[test]
    fn covers_never_weakens_exclusion() {
        for held in TokenMode::ALL {
            for wanted in TokenMode::ALL {
                if !covers(held, wanted) {
                    continue;
                }
                for other in TokenMode::ALL {
                    if compatible(held, other) {
                        assert!(
                            compatible(wanted, other),
                            "{held} covers {wanted} but admits {other} which {wanted} refuses"
                        );
                    }
                }
            }
        }
    }

    /// The manager checks conflicts against the requested mode only, then stores the
    /// join with what the node already held. That is sound only if a foreign mode that
    /// coexists with both parts also coexists with the join.
    #[test]
    fn join_preserves_compatibility() {
        for a in TokenMode::ALL {
            for b in TokenMode::ALL {
                let j = join(a, b);
                assert!(covers(j, a), "join({a},{b})={j} covers {a}");
                assert!(covers(j, b), "join({a},{b})={j} covers {b}");
                for other in TokenMode::ALL {
                    if compatible(a, other) && compatible(b, other) {
                        assert!(compatible(j, other), "join({a},{b}) vs {other}");
                    }
                }
            }
        }
    }

    #[test]
    fn display_names() {
        assert_eq!(Ro.to_string(), "ro");
        assert_eq!(Rw.to_string(), "rw");
        assert_eq!(Xw.to_string(), "xw");
    }
}
