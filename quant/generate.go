package quant

// The golden fixtures in testdata/golden.bin.gz come from llama.cpp's own C code; regenerating
// them needs gcc/g++ on an x86-64 machine with AVX2 (see tools/quantref/README.md).
//go:generate make -C ../tools/quantref golden
