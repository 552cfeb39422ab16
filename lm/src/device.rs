//! Which device the runtime computes on: `cpu` (the default, what CI tests) or `cuda`.

use std::fmt;
use std::str::FromStr;

use candle_core::Device;

use crate::error::{LmError, Result};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
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
            Self::Cuda => Device::new_cuda(0).map_err(|e| {
                let hint = if cfg!(feature = "cuda") {
                    "no usable GPU or driver: check nvidia-smi and that libcuda.so.1 and the \
                     CUDA 13 libraries are on the library path"
                } else {
                    "build with `--features cuda` on a machine with CUDA"
                };
                LmError::Device("cuda".into(), format!("{e} ({hint})"))
            }),
        }
    }
}

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
