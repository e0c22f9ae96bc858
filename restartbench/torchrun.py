"""torchrun as the study's launch script runs it: ``python -m restartbench.torchrun ARGS`` is
``python -m torch.distributed.run ARGS`` (the same arguments, parser and elastic agent, which forks the ranks from
its main thread as ``launchers.die_with_launcher`` needs), ending without the interpreter's teardown once every rank
has ended (``launchers.end_process``: about 0.7 s of a launch, measured on the 2-core machine, after the phase's
ranks are gone). A failed phase raises out of torchrun's ``main`` as it does under ``-m torch.distributed.run``."""

from torch.distributed.run import main as torchrun_main

from restartbench.launchers import end_process

if __name__ == "__main__":
    torchrun_main()
    end_process(0)
