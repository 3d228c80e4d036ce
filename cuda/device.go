package cuda

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/commit-run/commit-run/internal/dl"
)

// Attribute is a CUdevice_attribute.
type Attribute int32

// The attributes Info reads (cuda.h's CUdevice_attribute values).
const (
	AttrMaxSharedMemoryPerBlock      Attribute = 8
	AttrClockRate                    Attribute = 13 // kHz
	AttrMultiprocessorCount          Attribute = 16
	AttrPCIBusID                     Attribute = 33
	AttrPCIDeviceID                  Attribute = 34
	AttrMemoryClockRate              Attribute = 36 // kHz
	AttrGlobalMemoryBusWidth         Attribute = 37 // bits
	AttrL2CacheSize                  Attribute = 38 // bytes
	AttrPCIDomainID                  Attribute = 50
	AttrComputeCapabilityMajor       Attribute = 75
	AttrComputeCapabilityMinor       Attribute = 76
	AttrMaxSharedMemoryPerBlockOptin Attribute = 97
	AttrReadOnlyHostRegisterSupport  Attribute = 113
)

type deviceSyms struct {
	deviceGetCount, deviceGet, deviceGetName, deviceTotalMem, deviceGetAttribute uintptr
}

func (s *deviceSyms) table() []symbol {
	return []symbol{
		// CUresult cuDeviceGetCount(int *count);
		{Name: "cuDeviceGetCount", Addr: &s.deviceGetCount},
		// CUresult cuDeviceGet(CUdevice *device, int ordinal);
		{Name: "cuDeviceGet", Addr: &s.deviceGet},
		// CUresult cuDeviceGetName(char *name, int len, CUdevice dev);
		{Name: "cuDeviceGetName", Addr: &s.deviceGetName},
		// CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev);
		{Name: "cuDeviceTotalMem_v2", Addr: &s.deviceTotalMem},
		// CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev);
		{Name: "cuDeviceGetAttribute", Addr: &s.deviceGetAttribute},
	}
}

// Device is a GPU the driver sees, a CUdevice.
type Device struct {
	d       *Driver
	h       int32
	ordinal int
}

// Count is the number of GPUs the driver sees. A driver without GPUs may report no device
// as an error (CUDA_ERROR_NO_DEVICE); that is 0 here.
func (d *Driver) Count() (int, error) {
	var n int32
	if err := d.call("cuDeviceGetCount", d.deviceGetCount, uintptr(unsafe.Pointer(&n))); err != nil {
		if errors.Is(err, ErrNoDevice) {
			return 0, nil
		}
		return 0, err
	}
	return int(n), nil
}

// Device returns GPU number ordinal, or an error saying how many there are.
func (d *Driver) Device(ordinal int) (Device, error) {
	n, err := d.Count()
	if err != nil {
		return Device{}, err
	}
	if ordinal < 0 || ordinal >= n {
		return Device{}, fmt.Errorf("no CUDA device %d: the driver (%s, CUDA %s) sees %d", ordinal, d.path, versionString(d.version), n)
	}
	var h int32
	if err := d.call("cuDeviceGet", d.deviceGet, uintptr(unsafe.Pointer(&h)), uintptr(ordinal)); err != nil {
		return Device{}, err
	}
	return Device{d: d, h: h, ordinal: ordinal}, nil
}

// Ordinal is the device's number, N in cuda:N.
func (dev Device) Ordinal() int { return dev.ordinal }

// Name is the GPU's marketing name, e.g. "NVIDIA GeForce RTX 4090".
func (dev Device) Name() (string, error) {
	var buf [256]byte
	if err := dev.d.call("cuDeviceGetName", dev.d.deviceGetName, uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)-1), uintptr(dev.h)); err != nil {
		return "", err
	}
	return dl.GoString(unsafe.Pointer(&buf[0])), nil
}

// TotalMemory is the GPU's memory in bytes.
func (dev Device) TotalMemory() (int64, error) {
	var n uint64
	if err := dev.d.call("cuDeviceTotalMem_v2", dev.d.deviceTotalMem, uintptr(unsafe.Pointer(&n)), uintptr(dev.h)); err != nil {
		return 0, err
	}
	return int64(n), nil
}

// Attribute reads one attribute of the device.
func (dev Device) Attribute(a Attribute) (int, error) {
	var v int32
	if err := dev.d.call("cuDeviceGetAttribute", dev.d.deviceGetAttribute, uintptr(unsafe.Pointer(&v)), uintptr(a), uintptr(dev.h)); err != nil {
		return 0, fmt.Errorf("attribute %d: %w", a, err)
	}
	return int(v), nil
}

// Info is what a user and the engine want to know of a GPU.
type Info struct {
	Ordinal      int
	Name         string
	Memory       int64 // bytes
	Major, Minor int   // compute capability
	SMs          int
	ClockKHz     int
	MemClockKHz  int
	BusWidth     int // bits
	L2           int // bytes
	PCI          string
	// MemoryBandwidth is the theoretical peak in bytes/s from the memory clock and bus
	// width (double data rate), 0 when the driver does not say.
	MemoryBandwidth float64
}

// Info queries the device's name, memory and capabilities.
func (dev Device) Info() (Info, error) {
	in := Info{Ordinal: dev.ordinal}
	var err error
	if in.Name, err = dev.Name(); err != nil {
		return in, err
	}
	if in.Memory, err = dev.TotalMemory(); err != nil {
		return in, err
	}
	attrs := []struct {
		a   Attribute
		dst *int
	}{
		{AttrComputeCapabilityMajor, &in.Major}, {AttrComputeCapabilityMinor, &in.Minor},
		{AttrMultiprocessorCount, &in.SMs}, {AttrClockRate, &in.ClockKHz}, {AttrMemoryClockRate, &in.MemClockKHz},
		{AttrGlobalMemoryBusWidth, &in.BusWidth}, {AttrL2CacheSize, &in.L2},
	}
	for _, a := range attrs {
		if *a.dst, err = dev.Attribute(a.a); err != nil {
			return in, err
		}
	}
	// Newer drivers deprecate the clock attributes and may report 0; the PCI address is
	// informative only.
	dom, _ := dev.Attribute(AttrPCIDomainID)
	bus, _ := dev.Attribute(AttrPCIBusID)
	slot, _ := dev.Attribute(AttrPCIDeviceID)
	in.PCI = fmt.Sprintf("%04x:%02x:%02x.0", dom, bus, slot)
	in.MemoryBandwidth = 2 * float64(in.MemClockKHz) * 1e3 * float64(in.BusWidth) / 8
	return in, nil
}

// String is one line for a device list.
func (in Info) String() string {
	s := fmt.Sprintf("cuda:%d  %s  %.1f GiB  sm_%d%d  %d SMs", in.Ordinal, in.Name, float64(in.Memory)/(1<<30), in.Major, in.Minor, in.SMs)
	if in.MemoryBandwidth > 0 {
		s += fmt.Sprintf("  %.0f GB/s", in.MemoryBandwidth/1e9)
	}
	return s + "  PCI " + in.PCI
}

// versionString formats a cuDriverGetVersion number as "13.0".
func versionString(v int) string { return fmt.Sprintf("%d.%d", v/1000, v%1000/10) }
