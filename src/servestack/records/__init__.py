"""Each step's record as a typed, frozen value with one reader and one writer.

    lockfile: Lock (pins/<stack>.lock)            read_lock / write_lock
    steps:    BuildRecord (build/<stack>/build.json), ImageRecord (build/<stack>/image.json),
              ExpectedImage (pins/<stack>.image.json)  read_* / write_*
    smoke:    SmokeRecord (build/<stack>/smoke.json)  read_smoke / write_smoke
    fields:   Fields, the field-by-field JSON reader whose errors name file, field and expectation
    codec:    Record, each record's to_json/from_json derived from its dataclass declaration (quirks in metadata)

Records are canonical JSON written atomically; reading one back and writing it again gives the same bytes.
"""
