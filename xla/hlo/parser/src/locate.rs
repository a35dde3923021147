//! Where a computation or instruction is defined in HLO text, so that errors
//! found after parsing (the verifier's, the interpreter's) can name the
//! line:column as parse errors do.
//!
//! Invariants: a plain line scan, linear in the text and never panicking;
//! positions are 1-based; an instruction is looked up inside its
//! computation's body when the computation is found (names are unique per
//! module, so the first match elsewhere is the fallback); `None` when the
//! text does not define the name (e.g. an instruction a pass created).

/// A 1-based line and column in the text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Position {
    pub line: usize,
    pub column: usize,
}

/// The start of the definition of `name` on `line` (`%name = `, `name = `,
/// optionally after `ROOT `), as a 0-based byte column.
fn defines(line: &str, name: &str) -> Option<usize> {
    let indent = line.len() - line.trim_start().len();
    let mut rest = &line[indent..];
    let mut column = indent;
    if let Some(after) = rest.strip_prefix("ROOT ") {
        column += rest.len() - after.len();
        rest = after.trim_start();
        column += after.len() - rest.len();
    }
    let bare = rest.strip_prefix('%').unwrap_or(rest);
    let after = bare.strip_prefix(name)?;
    after.trim_start().starts_with('=').then_some(column)
}

/// Whether `line` opens computation `name` (`%name (`, `ENTRY %name {`, ...).
fn opens_computation(line: &str, name: &str) -> bool {
    let head = line.trim_start();
    let head = head.strip_prefix("ENTRY ").unwrap_or(head).trim_start();
    let head = head.strip_prefix('%').unwrap_or(head);
    head.strip_prefix(name).is_some_and(|after| {
        let after = after.trim_start();
        (after.starts_with('(') || after.starts_with('{')) && line.trim_end().ends_with('{')
    })
}

/// Where computation `computation` is opened in `text`.
pub fn locate_computation(text: &str, computation: &str) -> Option<Position> {
    text.lines()
        .position(|l| opens_computation(l, computation))
        .map(|i| Position {
            line: i + 1,
            column: 1,
        })
}

/// Where instruction `instruction` of computation `computation` is defined.
pub fn locate_instruction(text: &str, computation: &str, instruction: &str) -> Option<Position> {
    let lines: Vec<&str> = text.lines().collect();
    let find = |from: usize, to: usize| {
        (from..to).find_map(|i| {
            defines(lines[i], instruction).map(|column| Position {
                line: i + 1,
                column: column + 1,
            })
        })
    };
    if let Some(start) = lines.iter().position(|l| opens_computation(l, computation)) {
        let end = (start + 1..lines.len())
            .find(|&i| lines[i].trim_start().starts_with('}'))
            .unwrap_or(lines.len());
        if let Some(p) = find(start + 1, end) {
            return Some(p);
        }
    }
    find(0, lines.len())
}

/// `file:line:column` of the instruction (or computation) an error belongs
/// to, or just `file` when the text does not define it.
pub fn location(file: &str, text: &str, computation: &str, instruction: Option<&str>) -> String {
    let position = match instruction {
        Some(name) => locate_instruction(text, computation, name),
        None => locate_computation(text, computation),
    };
    match position {
        Some(p) => format!("{file}:{}:{}", p.line, p.column),
        None => file.to_string(),
    }
}

/// Each `(computation, instruction, message)` on its own line, prefixed by
/// the [`location`] of what it belongs to.
pub fn located_lines<'a>(
    file: &str,
    text: &str,
    errors: impl IntoIterator<Item = (&'a str, Option<&'a str>, String)>,
) -> String {
    let lines: Vec<String> = errors
        .into_iter()
        .map(|(computation, instruction, message)| {
            format!(
                "{}: {message}",
                location(file, text, computation, instruction)
            )
        })
        .collect();
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "HloModule m\n\n%add (a: f32[], b: f32[]) -> f32[] {\n  %a = f32[] parameter(0)\n  %b = f32[] parameter(1)\n  ROOT %s = f32[] add(%a, %b)\n}\n\nENTRY %main (p: f32[4]) -> f32[4] {\n  %p = f32[4]{0} parameter(0)\n  ROOT %s2 = f32[4]{0} negate(%p)\n}\n";

    #[test]
    fn finds_definitions() {
        assert_eq!(
            locate_instruction(TEXT, "main", "p"),
            Some(Position {
                line: 10,
                column: 3
            })
        );
        assert_eq!(
            locate_instruction(TEXT, "main", "s2"),
            Some(Position {
                line: 11,
                column: 8
            })
        );
        assert_eq!(
            locate_instruction(TEXT, "add", "s"),
            Some(Position { line: 6, column: 8 })
        );
        assert_eq!(
            locate_computation(TEXT, "main"),
            Some(Position { line: 9, column: 1 })
        );
        assert_eq!(locate_instruction(TEXT, "main", "nope"), None);
        assert_eq!(locate_instruction("", "x", "y"), None);
        assert_eq!(locate_instruction("ROOT", "x", "ROOT"), None);
        assert_eq!(location("f.hlo", TEXT, "main", Some("s2")), "f.hlo:11:8");
        assert_eq!(location("f.hlo", TEXT, "<module>", None), "f.hlo");
    }
}
