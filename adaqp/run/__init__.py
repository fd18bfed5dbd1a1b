"""Running a training job: the trainer's epoch loop (``trainer``), the gradient
all-reduce (``gradsync``), run outputs (``metrics``) and checkpoints (``checkpoint``);
where a run goes and whether it may start or resume (``placement``, the one owner of
that decision) and the claim on its directory (``rundir``). The command line is
``adaqp/train.py``."""
