"""Every job kind this agent can run, by "module:function" (imported only by the job process).

Add a kind with one line. Keep this module free of heavy imports: the daemon imports it.
`params=` names the function that reads the kind's params first (registry.refuse_bad_params).
"""

from .registry import register_job

_BUILTIN = "edge_remat_agent.daemon.builtin_jobs"

register_job("sysinfo", f"{_BUILTIN}:sysinfo_job",
             description="python/torch versions, free RAM and disk")
register_job("echo", f"{_BUILTIN}:echo_job",
             description="return the params (and a pushed file's size and sha256)")
register_job("sleep", f"{_BUILTIN}:sleep_job", params=f"{_BUILTIN}:sleep_params",
             description="sleep in checkpointed steps (resume tests)")
register_job("torch-check", f"{_BUILTIN}:torch_check_job", needs_torch=True,
             description="import torch and multiply two small matrices")

register_job("train-plain", "edge_remat_agent.plain_train:plain_train_job", needs_torch=True,
             params="edge_remat_agent.plain_train:plain_train_params",
             description="train a model with plain PyTorch for N steps (the comparison)")

register_job("run", "edge_remat_agent.executor.jobs:run_job", needs_torch=True,
             params="edge_remat_agent.executor.jobs:run_params",
             description="execute a plan on the board for N training steps and measure it")
register_job("profile", "edge_remat_agent.profiler.jobs:profile_job", needs_torch=True,
             params="edge_remat_agent.profiler.jobs:profile_options",
             description="measure every graph node, the flash, power and memory")
