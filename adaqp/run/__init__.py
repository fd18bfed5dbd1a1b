"""Running a training job: the trainer's epoch loop (``trainer``), the gradient
all-reduce (``gradsync``), run outputs (``metrics``), checkpoints (``checkpoint``) and
the run directory's life cycle (``rundir``). The command line is ``adaqp/train.py``."""
