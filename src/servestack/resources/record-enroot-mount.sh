#!/bin/sh
cat >> "$SERVESTACK_MOUNTS"
