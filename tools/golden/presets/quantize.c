// quantize: llama.cpp's own quantizer (llama_model_quantize, as llama-quantize calls it) on one
// GGUF file, with a preset given by its llama_ftype number. tools/golden/cmd/presets builds it
// against node-llama-cpp's prebuilt libllama and the headers of the same llama.cpp release.
//
//   quantize IN OUT FTYPE
#include <stdio.h>
#include <stdlib.h>

#include "llama.h"

int main(int argc, char** argv) {
	if (argc != 4) {
		fprintf(stderr, "usage: quantize IN OUT FTYPE\n");
		return 2;
	}
	llama_backend_init();
	llama_model_quantize_params p = llama_model_quantize_default_params();
	p.ftype = (enum llama_ftype)atoi(argv[3]);
	p.nthread = 2;
	const uint32_t rc = llama_model_quantize(argv[1], argv[2], &p);
	llama_backend_free();
	if (rc != 0) {
		fprintf(stderr, "quantize: llama_model_quantize(%s, %s, ftype %s) failed: %u\n", argv[1], argv[2], argv[3], rc);
		return 1;
	}
	return 0;
}
