package cuda

import "unsafe"

type initSyms struct {
	cuInit, driverGetVersion uintptr
}

func (s *initSyms) table() []symbol {
	return []symbol{
		// CUresult cuInit(unsigned int Flags);
		{Name: "cuInit", Addr: &s.cuInit},
		// CUresult cuDriverGetVersion(int *driverVersion);
		{Name: "cuDriverGetVersion", Addr: &s.driverGetVersion},
	}
}

// init initialises the driver and reads its version.
func (d *Driver) init() error {
	if err := d.call("cuInit", d.cuInit, 0); err != nil {
		return err
	}
	var v int32
	if err := d.call("cuDriverGetVersion", d.driverGetVersion, uintptr(unsafe.Pointer(&v))); err != nil {
		return err
	}
	d.version = int(v)
	return nil
}
