"""Page stores: where the executor puts tensors it pages out (`flash`, `host`) and gets them back.

    with FlashStore(page_dir, capacity_bytes=2**30) as flash:
        flash.put(node_id, tensor)      # page_out n flash
        tensor = flash.get(node_id)     # page_in n flash
        flash.discard(node_id)          # the plan is done with it
        flash.clear()                   # end of step

`host` is a LinkStore over the host's page service (service.py) when the run is given one, else
a MemoryStore in this process. All stores
share one page encoding (codec.py): a header, the raw tensor bytes, and a CRC32 checked on read.
"""

from .base import PageStore
from .codec import EncodedPage, PageHeader, decode, encode
from .errors import PageCorrupted, PageMissing, PageStoreError, PageStoreFull
from .flash import FlashStore
from .link import LinkStore
from .memory import MemoryStore
from .service import PageClient, PageService, PageServiceError, ServiceStore, connect_store

__all__ = ["PageStore", "FlashStore", "MemoryStore", "LinkStore", "PageStoreError",
           "PageStoreFull", "PageCorrupted", "PageMissing", "EncodedPage", "PageHeader", "encode",
           "decode", "PageService", "PageClient", "PageServiceError", "ServiceStore",
           "connect_store"]
