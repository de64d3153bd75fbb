"""The processes rentune starts besides the one a command runs, each rebuilt from the store alone:

rank.py      one torchrun rank of a trial's training (python -m entrypoint.processes.rank, by torchrun)
recheck.py   the verify phase's fresh process (python -m entrypoint.processes.recheck)
"""
