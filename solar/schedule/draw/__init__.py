"""What is drawn: the access order (one permutation per epoch, a sampler's draws, a trace's next
uses), a pure function of the seed and the run's shape. See solar/schedule/README.md."""
