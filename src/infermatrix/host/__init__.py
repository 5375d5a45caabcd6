"""Host checks: doctor, proxmox, the checks pull runs before a pull."""
