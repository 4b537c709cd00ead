"""`servestack image`: plan the layers from containers/image.yaml, write the ones not cached, push what
the registry lacks, and check the digest against the one committed beside the lock.

Planning (`plan`) returns data and needs no daemon. Writing a layer is tar + zstd + sha256 in this
process (layers.py); the config and manifest are assembled here (oci.py) and pushed through the
registry HTTP API, blob by blob, skipping blobs the registry already holds. No docker daemon is
involved. The same lock and the same code give the same manifest digest on any machine:
`pins/<stack>.image.json` records the digest expected for the committed lock.

- `spec`: containers/image.yaml read into a typed plan;
- `plan`: the layers above the base, from the build record and the installed trees;
- `base`: the base layer(s): a Debian root file system assembled from the lock, or a base image by digest;
- `uploads`: blobs pushed as they are written, and layers written while trees are still being made;
- `build`: the build itself, from the build record to the manifest in the registry;
- `expected`: the digest committed beside the lock (pins/<stack>.image.json).
"""

from servestack.image.base_image import debian_base, interpreter_version
from servestack.image.build import build_image, image_input_hash, image_record, load_image
from servestack.image.expected import UPDATE_COMMAND, check_expected, expected_file, write_expected
from servestack.image.index import push_index, record_index
from servestack.image.layer_plan import Layer, link_entries, own_layers, plan
from servestack.image.uploads import EarlyLayers, Uploads

__all__ = ["UPDATE_COMMAND", "EarlyLayers", "Layer", "Uploads", "build_image", "check_expected",
           "debian_base", "expected_file", "image_input_hash", "image_record", "interpreter_version", "link_entries",
           "load_image", "own_layers", "plan", "push_index", "record_index", "write_expected"]
