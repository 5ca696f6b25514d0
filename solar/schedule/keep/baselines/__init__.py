"""The policies solar is compared with (lru, fifo, the SOLAR artifact's, NoPFS's, a static
cache), on the same inputs. See solar/schedule/README.md."""
