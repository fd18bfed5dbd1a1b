"""What a process has of its machine: the cores it may use (``cores``), the signals that
stop it (``stop``), its time and peak memory by stage (``stages``), and files it writes
whole or not at all (``atomic``). Standard library only."""
