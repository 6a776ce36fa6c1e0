"""Page stores: where the executor puts tensors it pages out (`flash`, `host`) and gets them back.

    with FlashStore(page_dir, capacity_bytes=2**30) as flash:
        flash.put(node_id, tensor)      # page_out n flash
        tensor = flash.get(node_id)     # page_in n flash
        flash.discard(node_id)          # the plan is done with it
        flash.clear()                   # end of step

`host` is a LinkStore over the host's page service (service.py) when the run is given one, else
a MemoryStore in this process; for a run on a CUDA device, a PinnedStore (pinned host memory
that the device copies to and from). The stores that hold bytes (flash, link, memory) share one
page encoding (codec.py): a header, the raw tensor bytes, and a CRC32 checked on read.
"""

# Names are resolved on first use, so that the host's page service (service.py, standard
# library only) can be imported without torch, which the stores need.
_HOMES = {
    "PageStore": "base",
    "EncodedPage": "codec", "PageHeader": "codec", "decode": "codec", "encode": "codec",
    "PageCorrupted": "errors", "PageMissing": "errors", "PageStoreError": "errors",
    "PageStoreFull": "errors",
    "FlashStore": "flash",
    "LinkStore": "link", "ServiceStore": "link", "connect_store": "link",
    "MemoryStore": "memory",
    "PinnedStore": "pinned",
    "PageClient": "service", "PageService": "service", "PageServiceError": "service",
}
__all__ = list(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{_HOMES[name]}", __name__), name)
    globals()[name] = value
    return value
