-- Instance-wide settings (the operators' pause switch, the instance id).
CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
