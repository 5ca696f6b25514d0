"""Who keeps what: which rank serves each access, and which rows each buffer keeps (Belady),
per rank or per host. See solar/schedule/README.md."""
