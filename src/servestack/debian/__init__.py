"""The image's Debian base, from locked packages: resolved at lock time (resolve), assembled on the
host at image time without running a maintainer script or an emulator (rootfs), with what those
scripts would have done done here instead (scripts, ldcache)."""
