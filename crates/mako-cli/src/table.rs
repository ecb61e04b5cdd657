//! Aligned text tables: a header row, a rule, then rows; numeric-looking columns are
//! right-aligned so that digits line up.

/// A table being built.
pub struct Table {
    headers: Vec<String>,
    rows: Vec<Vec<String>>,
    right: Vec<bool>,
}

impl Table {
    /// A table with these column headers.
    pub fn new(headers: &[&str]) -> Self {
        Table {
            headers: headers.iter().map(|h| h.to_string()).collect(),
            rows: Vec::new(),
            right: vec![false; headers.len()],
        }
    }

    /// Right-aligns the given columns (numbers).
    pub fn right_align(mut self, columns: &[usize]) -> Self {
        for &c in columns {
            if c < self.right.len() {
                self.right[c] = true;
            }
        }
        self
    }

    /// Adds a row; missing cells are empty.
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// True if no row was added.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The table as text, every line ending in `\n`, without trailing spaces.
    pub fn render(&self) -> String {
        let columns = self.headers.len();
        let mut widths: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (c, cell) in row.iter().enumerate().take(columns) {
                widths[c] = widths[c].max(cell.chars().count());
            }
        }
        let mut out = String::new();
        let line = |cells: &[String], out: &mut String| {
            let mut text = String::new();
            for (c, width) in widths.iter().enumerate() {
                let cell = cells.get(c).map(String::as_str).unwrap_or("");
                let pad = width - cell.chars().count();
                if c > 0 {
                    text.push_str("  ");
                }
                if self.right[c] {
                    text.push_str(&" ".repeat(pad));
                    text.push_str(cell);
                } else {
                    text.push_str(cell);
                    text.push_str(&" ".repeat(pad));
                }
            }
            out.push_str(text.trim_end());
            out.push('\n');
        };
        line(&self.headers, &mut out);
        let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
        line(&rule, &mut out);
        for row in &self.rows {
            line(row, &mut out);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligns_columns() {
        let mut t = Table::new(&["name", "size"]).right_align(&[1]);
        t.row(vec!["d0".into(), "8.0 GiB".into()]);
        t.row(vec!["disk-long".into(), "1 B".into()]);
        assert_eq!(
            t.render(),
            "name          size\n---------  -------\nd0         8.0 GiB\ndisk-long      1 B\n"
        );
    }
}
