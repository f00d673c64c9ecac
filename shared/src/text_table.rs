//! Plain-text tables for the CLI's terminal output (`simulate`, `status`).

/// Rows as columns padded to their widest cell, two spaces apart, one line
/// each with trailing spaces trimmed (pure).
pub fn columns<R: AsRef<[String]>>(rows: &[R]) -> String {
    let width = rows.first().map_or(0, |r| r.as_ref().len());
    let widths: Vec<usize> = (0..width)
        .map(|i| rows.iter().map(|r| r.as_ref()[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in rows {
        let line: Vec<String> = r
            .as_ref()
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}", w = *w))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_line_up_under_the_widest_and_lines_end_without_spaces() {
        let rows = vec![
            vec!["NAME".to_string(), "$/H".to_string(), "".to_string()],
            vec!["a-long-name".to_string(), "0.1".to_string(), "".to_string()],
        ];
        assert_eq!(columns(&rows), "NAME         $/H\na-long-name  0.1\n");
    }
}
