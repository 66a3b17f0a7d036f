//! Name rules: which file names may enter a tree that engineers will later check out
//! (which thread ids may become a branch and a directory is `ids::ThreadId`'s rule).

/// The namespace every thread branch lives in, below `refs/heads/`.
pub(crate) const BRANCH_PREFIX: &str = "threadgate/";

/// Why a file name cannot be stored in a tree or written into a worktree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NameProblem {
    /// Empty, `.`, `..`, or containing `/` or NUL: not one path component.
    NotAComponent,
    /// A name that git (on some platform) treats as its own `.git` directory.
    ReservedGitName,
}

/// Checks one path component (as raw bytes) for use as a tree entry name.
///
/// Besides the structural rules, names that git would refuse on checkout on any
/// platform are reserved: `.git` in any letter case, with trailing dots or spaces
/// (NTFS), with HFS+ ignorable code points inside, and the NTFS short name `git~1`.
pub(crate) fn check_entry_name(name: &[u8]) -> Result<(), NameProblem> {
    if name.is_empty() || name == b"." || name == b".." || name.contains(&b'/') || name.contains(&0)
    {
        return Err(NameProblem::NotAComponent);
    }
    if is_reserved_git_name(name) {
        return Err(NameProblem::ReservedGitName);
    }
    Ok(())
}

/// True for `.git` and the names other filesystems fold into it.
fn is_reserved_git_name(name: &[u8]) -> bool {
    let folded = strip_hfs_ignorables(name);
    let trimmed = trim_end_dots_spaces(&folded);
    trimmed.eq_ignore_ascii_case(b".git") || trimmed.eq_ignore_ascii_case(b"git~1")
}

/// True for the dotfiles that git refuses to follow as symlinks on checkout
/// (`.gitmodules`) or warns about (`.gitattributes`, `.gitignore`, `.mailmap`).
pub(crate) fn is_git_control_file(name: &[u8]) -> bool {
    let folded = strip_hfs_ignorables(name);
    let trimmed = trim_end_dots_spaces(&folded);
    [
        &b".gitmodules"[..],
        b".gitattributes",
        b".gitignore",
        b".mailmap",
    ]
    .iter()
    .any(|control| trimmed.eq_ignore_ascii_case(control))
}

fn trim_end_dots_spaces(name: &[u8]) -> &[u8] {
    let end = name
        .iter()
        .rposition(|b| *b != b'.' && *b != b' ')
        .map_or(0, |i| i + 1);
    name.get(..end).unwrap_or(name)
}

/// Removes the code points HFS+ ignores when comparing names (the list git uses in
/// `utf8.c`), so that `.g\u{200c}it` compares equal to `.git`.
fn strip_hfs_ignorables(name: &[u8]) -> Vec<u8> {
    let Ok(text) = std::str::from_utf8(name) else {
        return name.to_vec();
    };
    let ignorable = |c: char| {
        matches!(
            c,
            '\u{200c}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{206a}'..='\u{206f}' | '\u{feff}'
        )
    };
    text.chars()
        .filter(|c| !ignorable(*c))
        .collect::<String>()
        .into_bytes()
}

/// A remote name or URL fit for errors and logs: any `user:password@` part of a URL is
/// replaced, since such a part is a credential.
pub(crate) fn redact_remote(remote: &str) -> String {
    let Some(scheme_end) = remote.find("://") else {
        return remote.to_owned();
    };
    let rest = &remote[scheme_end + 3..];
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{}***@{}", &remote[..scheme_end + 3], &rest[at + 1..]),
        None => remote.to_owned(),
    }
}

/// The `user:password` (or token) part of a URL's authority, when it has one.
pub(crate) fn userinfo(remote: &str) -> Option<&str> {
    let (_, rest) = remote.split_once("://")?;
    let authority = rest.split('/').next().unwrap_or(rest);
    let (userinfo, _) = authority.rsplit_once('@')?;
    (!userinfo.is_empty()).then_some(userinfo)
}
