"""One trial with the job's context (context.PhaseContext): what the phases and the process entry points
call, so that phases only orchestrate.

    train.py     train a trial to its planned end and commit its weights (in this process or a torchrun rank)
    recheck.py   the verify phase's recheck of the selected trial, in a fresh process
"""
