"""The float32 precision policy of cuDNN convolutions (TF32 or IEEE), as torch's flags set it."""
from __future__ import annotations


# Note [TF32 policy]
# torch >= 2.9 keeps a per-operator precision, torch.backends.cudnn.conv.fp32_precision ('tf32' by default), that
# inherits when 'none' from torch.backends.cudnn.fp32_precision and then from torch.backends.fp32_precision; 'none'
# all the way up means IEEE float32 (the legacy setter ``torch.backends.cudnn.allow_tf32 = False`` leaves exactly
# that). The legacy getter raises once the conv and RNN flags differ, so it is read only on older torch. Every
# float32 kernel choice that may use TF32 (cuDNN's, and the own kernel sets' tensor-core tiles) follows this rule.
def conv_tf32(torch) -> tuple[bool, str]:
    """Whether float32 convolutions may use TF32, and the setting that says so."""
    conv = getattr(getattr(torch.backends.cudnn, "conv", None), "fp32_precision", None)
    if conv is None:
        allowed = bool(torch.backends.cudnn.allow_tf32)
        return allowed, f"torch.backends.cudnn.allow_tf32 = {allowed}"
    chain = (("torch.backends.cudnn.conv.fp32_precision", conv),
             ("torch.backends.cudnn.fp32_precision", getattr(torch.backends.cudnn, "fp32_precision", "none")),
             ("torch.backends.fp32_precision", getattr(torch.backends, "fp32_precision", "none")))
    for name, value in chain:
        if value in ("tf32", "ieee"):
            return value == "tf32", f"{name} = '{value}'"
    return False, "every fp32_precision from cudnn.conv up is 'none' (IEEE float32)"
