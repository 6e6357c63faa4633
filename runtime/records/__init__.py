"""Fixed-size records of segments kept off the device: host tables, NVMe reads (io_uring or threads), an LRU."""
