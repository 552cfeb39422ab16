//! Which device the runtime computes on: `cpu` (the default, what CI tests) or `cuda`.

use display_full_error::DisplayFullErrorExt;
use std::fmt;
use std::str::FromStr;

use candle_core::Device;

use crate::error::{LmError, Result};

#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    #[default]
    Cpu,
    Cuda,
}

impl DeviceKind {
    /// Opens the device; `cuda` fails with a message when this build has no CUDA support.
    pub fn open(self) -> Result<Device> {
        match self {
            Self::Cpu => Ok(Device::Cpu),
            Self::Cuda => {
                let device = Device::new_cuda(0).map_err(|e| {
                    let hint = if cfg!(feature = "cuda") {
                        "no usable GPU or driver: check nvidia-smi and that libcuda.so.1 and \
                         the CUDA 13 libraries are on the library path"
                    } else {
                        "build with `--features cuda` on a machine with CUDA"
                    };
                    LmError::Device("cuda".into(), format!("{} ({hint})", e.display_full()))
                })?;
                without_event_tracking(&device);
                Ok(device)
            }
        }
    }
}

/// cudarc gives every allocation two CUDA events, which order work only between streams it
/// created itself; candle computes on one stream per device and creates none, so the events
/// are never waited on, while creating and destroying them costs four driver calls per
/// tensor, and a small model's forward pass makes about a thousand tensors.
#[cfg(feature = "cuda")]
#[allow(unsafe_code)]
fn without_event_tracking(device: &Device) {
    if let Device::Cuda(cuda) = device {
        // SAFETY: no other stream of this context exists or is created (candle uses the
        // per-thread stream), so no synchronisation between streams is given up.
        unsafe { cuda.disable_event_tracking() };
    }
}

#[cfg(not(feature = "cuda"))]
fn without_event_tracking(_device: &Device) {}

impl FromStr for DeviceKind {
    type Err = LmError;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "cpu" => Ok(Self::Cpu),
            "cuda" => Ok(Self::Cuda),
            other => Err(LmError::Device(
                other.into(),
                "expected `cpu` or `cuda`".into(),
            )),
        }
    }
}

impl fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Cpu => "cpu",
            Self::Cuda => "cuda",
        })
    }
}
