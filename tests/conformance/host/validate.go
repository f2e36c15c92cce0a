package main

// Nomad's validation rules, as pure functions returning findings
// (Nomad's `plugins/base/plugin.go` PluginInfo, `plugins/device` fingerprint,
// stats and reserve, `plugins/shared/structs/units.go` units).

import (
	"fmt"
	"path"
	"sort"
	"strings"

	version "github.com/hashicorp/go-version"

	basepb "lingjunconf/pb/base"
	devicepb "lingjunconf/pb/device"
	structspb "lingjunconf/pb/structs"
)

// Finding is one rule breach.
type Finding struct {
	Rule   string
	Detail string
}

// nomadDeviceAPIVersion is device.ApiVersion010.
const nomadDeviceAPIVersion = "v0.1.0"

func validatePluginInfo(info *basepb.PluginInfoResponse) (found []Finding, apiVersion string) {
	if info.GetType() != basepb.PluginType_DEVICE {
		found = append(found, Finding{"plugin_info.type", fmt.Sprintf("type is %v; a device plugin must report DEVICE", info.GetType())})
	}
	if len(info.GetPluginApiVersions()) == 0 {
		found = append(found, Finding{"plugin_info.api_versions_empty", "plugin_api_versions is empty"})
	}
	want := version.Must(version.NewVersion(nomadDeviceAPIVersion))
	for _, v := range info.GetPluginApiVersions() {
		pv, err := version.NewVersion(v)
		if err != nil {
			found = append(found, Finding{"plugin_info.api_version_invalid", fmt.Sprintf("plugin_api_versions entry %q does not parse: %v", v, err)})
			continue
		}
		if pv.Equal(want) && apiVersion == "" {
			apiVersion = v // Nomad sends the plugin's own spelling back
		}
	}
	if apiVersion == "" && len(info.GetPluginApiVersions()) > 0 {
		found = append(found, Finding{"plugin_info.api_version_no_overlap",
			fmt.Sprintf("plugin_api_versions %v has no version equal to %s; Nomad would skip the plugin", info.GetPluginApiVersions(), nomadDeviceAPIVersion)})
	}
	if _, err := version.NewVersion(info.GetPluginVersion()); err != nil {
		found = append(found, Finding{"plugin_info.plugin_version_invalid", fmt.Sprintf("plugin_version %q does not parse: %v", info.GetPluginVersion(), err)})
	}
	if info.GetName() == "" {
		found = append(found, Finding{"plugin_info.name_empty", "name is empty"})
	}
	return found, apiVersion
}

// knownUnits is plugins/shared/structs/units.go: bytes, byte rates, hertz,
// watts. No plain B, Hz, %, C.
var knownUnits = func() map[string]bool {
	m := map[string]bool{}
	for _, u := range []string{"KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "kB", "KB", "MB", "GB", "TB", "PB", "EB"} {
		m[u] = true
		m[u+"/s"] = true
	}
	for _, u := range []string{"MHz", "GHz", "mW", "W", "kW", "MW", "GW"} {
		m[u] = true
	}
	return m
}()

func groupKey(vendor, typ, name string) string { return vendor + "/" + typ + "/" + name }

// validateFingerprint returns violations (Nomad rejects the message and
// stops the plugin for good) and warnings (tolerated, but a defect).
func validateFingerprint(resp *devicepb.FingerprintResponse) (violations, warnings []Finding) {
	seen := map[string]int{}
	for gi, g := range resp.GetDeviceGroup() {
		if g == nil {
			violations = append(violations, Finding{"fingerprint.group_nil", fmt.Sprintf("group %d is null", gi)})
			continue
		}
		key := groupKey(g.GetVendor(), g.GetDeviceType(), g.GetDeviceName())
		where := fmt.Sprintf("group %d (%s)", gi, key)
		if g.GetVendor() == "" {
			violations = append(violations, Finding{"fingerprint.vendor_empty", where + ": vendor is empty"})
		}
		if g.GetDeviceType() == "" {
			violations = append(violations, Finding{"fingerprint.device_type_empty", where + ": device_type is empty"})
		}
		if g.GetDeviceName() == "" {
			violations = append(violations, Finding{"fingerprint.device_name_empty", where + ": device_name is empty"})
		}
		if prev, dup := seen[key]; dup {
			violations = append(violations, Finding{"fingerprint.duplicate_group",
				fmt.Sprintf("groups %d and %d share vendor/type/name %s (the scheduler keys groups by it)", prev, gi, key)})
		} else {
			seen[key] = gi
		}
		ids := map[string]bool{}
		for di, d := range g.GetDevices() {
			if d.GetID() == "" {
				violations = append(violations, Finding{"fingerprint.device_id_empty", fmt.Sprintf("%s device %d: ID is empty", where, di)})
				continue
			}
			if ids[d.GetID()] {
				warnings = append(warnings, Finding{"fingerprint.duplicate_device_id", fmt.Sprintf("%s: device ID %q appears twice", where, d.GetID())})
			}
			ids[d.GetID()] = true
		}
		names := make([]string, 0, len(g.GetAttributes()))
		for k := range g.GetAttributes() {
			names = append(names, k)
		}
		sort.Strings(names)
		for _, k := range names {
			if f := validateAttribute(g.GetAttributes()[k]); f != nil {
				f.Detail = fmt.Sprintf("%s attribute %q: %s", where, k, f.Detail)
				violations = append(violations, *f)
			}
		}
	}
	return violations, warnings
}

func validateAttribute(a *structspb.Attribute) *Finding {
	if a == nil || a.GetValue() == nil {
		return &Finding{"fingerprint.attribute_no_value", "no attribute value set"}
	}
	if a.GetUnit() == "" {
		return nil
	}
	if !knownUnits[a.GetUnit()] {
		return &Finding{"fingerprint.attribute_unknown_unit", fmt.Sprintf("unit %q is not one of Nomad's units", a.GetUnit())}
	}
	switch a.GetValue().(type) {
	case *structspb.Attribute_IntVal, *structspb.Attribute_FloatVal:
		return nil
	}
	return &Finding{"fingerprint.attribute_unit_non_numeric", fmt.Sprintf("unit %q on a non-numeric value", a.GetUnit())}
}

// validateStats checks a stats message against the fingerprinted groups.
// known maps group key -> set of IDs, from the latest and previous
// fingerprint (a stats message may race a fingerprint change).
func validateStats(resp *devicepb.StatsResponse, known map[string]map[string]bool) []Finding {
	var found []Finding
	for gi, g := range resp.GetGroups() {
		key := groupKey(g.GetVendor(), g.GetType(), g.GetName())
		ids, ok := known[key]
		if !ok {
			found = append(found, Finding{"stats.unknown_group", fmt.Sprintf("stats group %d %s matches no fingerprinted group", gi, key)})
			continue
		}
		keys := make([]string, 0, len(g.GetInstanceStats()))
		for id := range g.GetInstanceStats() {
			keys = append(keys, id)
		}
		sort.Strings(keys)
		for _, id := range keys {
			if !ids[id] {
				found = append(found, Finding{"stats.unknown_instance", fmt.Sprintf("stats for %s[%s], an ID not fingerprinted in that group", key, id)})
			}
		}
	}
	return found
}

// validateReservation checks a successful Reserve response.
func validateReservation(resp *devicepb.ReserveResponse) []Finding {
	cr := resp.GetContainerRes()
	if cr == nil {
		return []Finding{{"reserve.container_res_missing", "ReserveResponse.container_res is unset (the Nomad agent dereferences it)"}}
	}
	var found []Finding
	for i, d := range cr.GetDevices() {
		for _, p := range []struct{ n, v string }{{"task_path", d.GetTaskPath()}, {"host_path", d.GetHostPath()}} {
			if !path.IsAbs(p.v) {
				found = append(found, Finding{"reserve.path_not_absolute", fmt.Sprintf("devices[%d].%s %q is not absolute", i, p.n, p.v)})
			}
		}
		if strings.Trim(d.GetPermissions(), "rwm") != "" {
			found = append(found, Finding{"reserve.bad_permissions", fmt.Sprintf("devices[%d].permissions %q has characters other than r, w, m", i, d.GetPermissions())})
		}
	}
	for i, m := range cr.GetMounts() {
		for _, p := range []struct{ n, v string }{{"task_path", m.GetTaskPath()}, {"host_path", m.GetHostPath()}} {
			if !path.IsAbs(p.v) {
				found = append(found, Finding{"reserve.path_not_absolute", fmt.Sprintf("mounts[%d].%s %q is not absolute", i, p.n, p.v)})
			}
		}
	}
	return found
}
