package engine

import "testing"

// A real card finds the profile of its kind by the name the driver gives it.
func TestProfileOfKind(t *testing.T) {
	for _, c := range []struct{ driver, want string }{
		{"NVIDIA GeForce RTX 4090", "rtx4090"},
		{"NVIDIA GeForce RTX 2080 Ti", "rtx2080ti"},
		{"NVIDIA GeForce RTX 2080", "rtx2080"},
		{"NVIDIA H100 PCIe", "h100-pcie"},
		{"NVIDIA H200", "h200"},
		{"Tesla T4", ""},
		{"NVIDIA GeForce RTX 2080 SUPER", ""},
	} {
		p := profileOfKind(c.driver)
		got := ""
		if p != nil {
			got = p.Name
		}
		if got != c.want {
			t.Errorf("%q: profile %q, want %q", c.driver, got, c.want)
		}
	}
}
