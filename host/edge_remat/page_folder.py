"""Which folder a board's jobs page to and measure as its flash: one answer for the profile job
(the flash tier it measures: bandwidth and capacity_bytes, the free space there), the run and
deploy jobs (where they page) and the profile cache (a profile is only as good as the folder
its flash was measured in).

The device config's `[hardware] page_dir`, as the board reads it (`~` the board user's home,
a relative path under the workdir); without one, the agent's WORKDIR/pages
(edge_remat_agent.daemon.layout.job_page_dir). QA: `run --device` of a config whose page_dir
was a 20 MiB tmpfs measured the flash in the workdir's pages on the root disk (71.9 GB), planned
with it and failed at its first page-out; the profile cache keyed no folder at all, so a
config with another page_dir on the same machine planned with the first one's flash.
"""

from __future__ import annotations

import posixpath

from .devices import DeviceConfig

DEFAULT_PAGES = "pages"  # under the workdir, where the device config names no page_dir


def page_dir_params(device: DeviceConfig) -> dict:
    """The `page_dir` param of each job of `device`'s board that pages or measures the flash
    (run, profile, the profile's timing under a plan): the config's page_dir; none without
    one, the agent then taking its own WORKDIR/pages."""
    return {"page_dir": device.hardware.page_dir} if device.hardware.page_dir else {}


def page_folder(device: DeviceConfig) -> str:
    """The folder `device`'s jobs page to, in the config's words (`~` unexpanded: the board
    user's home, on the board): what a profile's flash figures belong to."""
    chosen = device.hardware.page_dir
    if chosen and (chosen.startswith("/") or chosen.startswith("~")):
        return posixpath.normpath(chosen) if chosen.startswith("/") else chosen.rstrip("/")
    return posixpath.normpath(posixpath.join(device.connection.workdir,
                                             chosen or DEFAULT_PAGES))
