#!/bin/sh
printf '%s\n' "$@" > "$SERVESTACK_RECORD"
