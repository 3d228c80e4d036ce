package cuda

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"unsafe"

	"github.com/commit-run/commit-run/internal/dl"
)

// CUjit_option values for the logs of a PTX load.
const (
	jitErrorLogBuffer          = 5 // CU_JIT_ERROR_LOG_BUFFER
	jitErrorLogBufferSizeBytes = 6 // CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES
)

// funcAttrMaxDynamicSharedSize is CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES.
const funcAttrMaxDynamicSharedSize = 8

type moduleSyms struct {
	moduleLoadDataEx, moduleUnload, moduleGetFunction, funcSetAttribute uintptr
}

func (s *moduleSyms) table() []symbol {
	return []symbol{
		// CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int numOptions, CUjit_option *options, void **optionValues);
		{Name: "cuModuleLoadDataEx", Addr: &s.moduleLoadDataEx},
		// CUresult cuModuleUnload(CUmodule hmod);
		{Name: "cuModuleUnload", Addr: &s.moduleUnload},
		// CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name);
		{Name: "cuModuleGetFunction", Addr: &s.moduleGetFunction},
		// CUresult cuFuncSetAttribute(CUfunction hfunc, CUfunction_attribute attrib, int value);
		{Name: "cuFuncSetAttribute", Addr: &s.funcSetAttribute},
	}
}

// Module is loaded device code, a CUmodule.
type Module struct {
	c *Context
	h uintptr
}

// LoadModule loads a PTX (or cubin) image into the context; the driver compiles PTX for
// the device on the first load. A PTX that does not compile fails with the compiler's log.
func (c *Context) LoadModule(image []byte) (*Module, error) {
	if len(image) == 0 {
		return nil, fmt.Errorf("cuda: loading an empty module")
	}
	img := make([]byte, len(image)+1) // PTX is read up to a NUL
	copy(img, image)
	logBuf := make([]byte, 8192)
	// The driver writes the log through a pointer held in vals: pinning keeps the buffer on
	// the heap, where it does not move.
	var pin runtime.Pinner
	pin.Pin(&logBuf[0])
	defer pin.Unpin()
	opts := [2]int32{jitErrorLogBuffer, jitErrorLogBufferSizeBytes}
	vals := [2]uintptr{uintptr(unsafe.Pointer(&logBuf[0])), uintptr(len(logBuf) - 1)}
	var h uintptr
	err := c.do("cuModuleLoadDataEx", c.d.moduleLoadDataEx, uintptr(unsafe.Pointer(&h)), uintptr(unsafe.Pointer(&img[0])),
		uintptr(len(opts)), uintptr(unsafe.Pointer(&opts[0])), uintptr(unsafe.Pointer(&vals[0])))
	if err != nil {
		var e *Error
		if errors.As(err, &e) {
			e.Log = strings.TrimSpace(dl.GoString(unsafe.Pointer(&logBuf[0])))
		}
		return nil, fmt.Errorf("cuda:%d: loading a %d-byte module: %w", c.dev.ordinal, len(image), err)
	}
	return &Module{c: c, h: h}, nil
}

// Unload releases the module; its functions must not be launched after.
func (m *Module) Unload() error {
	if m.h == 0 {
		return nil
	}
	err := m.c.do("cuModuleUnload", m.c.d.moduleUnload, m.h)
	m.h = 0
	return err
}

// Function is a kernel of a module, a CUfunction.
type Function struct {
	c    *Context
	h    uintptr
	Name string
}

// Function looks up the kernel called name (an extern "C" name).
func (m *Module) Function(name string) (*Function, error) {
	cname := append([]byte(name), 0)
	var h uintptr
	if err := m.c.do("cuModuleGetFunction", m.c.d.moduleGetFunction, uintptr(unsafe.Pointer(&h)), m.h, uintptr(unsafe.Pointer(&cname[0]))); err != nil {
		return nil, fmt.Errorf("kernel %s: %w", name, err)
	}
	return &Function{c: m.c, h: h, Name: name}, nil
}

// SetMaxDynamicShared lets the kernel use n bytes of dynamic shared memory, beyond the
// default 48 KiB where the device allows it.
func (f *Function) SetMaxDynamicShared(n int) error {
	if err := f.c.do("cuFuncSetAttribute", f.c.d.funcSetAttribute, f.h, funcAttrMaxDynamicSharedSize, uintptr(n)); err != nil {
		return fmt.Errorf("kernel %s: %w", f.Name, err)
	}
	return nil
}
