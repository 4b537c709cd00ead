"""The image's Debian base, from locked packages: chosen at lock time from texts the lock fetched
(closure, which does no I/O), assembled on the host at image time without running a maintainer
script or an emulator (rootfs), with what those scripts would have done done here instead (scripts,
ldcache)."""
