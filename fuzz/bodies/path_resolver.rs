// Fuzz body shared by cargo fuzz and the stable smoke run: the file API's path
// normalisation never panics, always yields an absolute path without `.`, `..` or empty
// components, and never one under /proc, /sys or /dev once checked.
pub fn run(data: &[u8]) {
    use std::path::Component;
    use threadbox_agent::path;
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    for home in ["/home/user", "/root"] {
        if let Ok(p) = path::normalize(s, home) {
            assert!(p.is_absolute(), "{p:?}");
            assert!(p
                .components()
                .all(|c| matches!(c, Component::RootDir | Component::Normal(_))));
            assert!(p.as_os_str().len() <= path::MAX_PATH + home.len() + 1);
        }
        if let Ok(p) = path::checked(s, home) {
            for root in path::FORBIDDEN_ROOTS {
                assert!(!p.starts_with(root), "{p:?} under {root}");
            }
        }
    }
}
